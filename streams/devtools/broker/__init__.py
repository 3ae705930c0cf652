"""The local Kafka broker: fetch it, start it (one node, or a cluster of N), know when it is
ready, stop it, kill it.

trajstream needs a real broker for its integration tests and for ``trajstream broker``, and
this machine may have no Docker. So the broker is Apache Kafka itself, run from its jars in
KRaft combined mode (each JVM is both broker and controller). The modules, along the seams:

* :mod:`.jars`: fetching the jars (and other artifacts) with Maven into the cache dir;
* :mod:`.config`: rendering ``server.properties``, certificates, the cluster id;
* :mod:`.process`: ports, pids, signals, the readiness probe;
* :mod:`.local`: :class:`LocalBroker`, one broker process for the life of a test or script::

      with LocalBroker(cache_dir) as broker:
          produce(broker.bootstrap_servers)

* :mod:`.cluster`: :class:`LocalCluster`, N brokers forming one cluster (a controller quorum
  of N), with kill/restart of a node and who leads a partition or the quorum;
* :mod:`.detached`: :func:`start_detached`, :func:`status` and :func:`stop_detached` run one
  broker (or cluster) per cache dir in the background, outliving the Python process, recorded
  in ``<cache_dir>/broker.json`` (this is what the CLI uses).

POSIX only: each broker runs in its own process group, which is signalled as a whole.

May import: the standard library, aiokafka (to probe readiness), :mod:`streams.errors`.
"""

from .cluster import LocalCluster
from .config import (
    TlsFiles,
    new_cluster_id,
    render_server_properties,
    write_certificates,
)
from .detached import DEFAULT_DETACHED_PORT, BrokerState, start_detached, status, stop_detached
from .jars import (
    KAFKA_VERSION,
    fetch_artifact,
    render_log4j2_config,
    render_pom,
    require_executable,
)
from .local import LocalBroker
from .process import free_port, port_answers, port_is_free

__all__ = [
    "DEFAULT_DETACHED_PORT",
    "KAFKA_VERSION",
    "BrokerState",
    "LocalBroker",
    "LocalCluster",
    "TlsFiles",
    "fetch_artifact",
    "free_port",
    "new_cluster_id",
    "port_answers",
    "port_is_free",
    "render_log4j2_config",
    "render_pom",
    "render_server_properties",
    "require_executable",
    "start_detached",
    "status",
    "stop_detached",
    "write_certificates",
]
