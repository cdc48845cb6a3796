"""Rule state that outlives the process: snapshots in a store (a local directory, or a
compacted Kafka topic that moves with the partitions), and the recovery that puts a
partition's state back on assignment."""

from vigil.daemon.state.kafka_store import KafkaStore
from vigil.daemon.state.recovery import Restored, restore_partition
from vigil.daemon.state.store import FileStore, Snapshot, StateStore

__all__ = ["FileStore", "KafkaStore", "Restored", "Snapshot", "StateStore", "restore_partition"]
