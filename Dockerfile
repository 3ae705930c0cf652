# The trajstream image: worker, stand-in, producer and CLI (docker-compose.yml uses it).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY streams ./streams
COPY examples ./examples
RUN pip install --no-cache-dir .
ENV TRAJSTREAM_DATA_DIR=/var/lib/trajstream
ENTRYPOINT ["trajstream"]
CMD ["--help"]
