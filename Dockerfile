# The trajstream image: worker, stand-in, producer and CLI (docker-compose.yml uses it).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md requirements-runtime.lock ./
# the runtime dependencies exactly as locked (hashes checked), then the package itself
RUN pip install --no-cache-dir --require-hashes -r requirements-runtime.lock
COPY schemas ./schemas
COPY streams ./streams
COPY examples ./examples
RUN pip install --no-cache-dir --no-deps .
ENV TRAJSTREAM_DATA_DIR=/var/lib/trajstream
ENTRYPOINT ["trajstream"]
CMD ["--help"]
