"""Rule state that outlives the process: snapshots in a store, and the recovery that puts a
partition's state back on assignment."""

from vigil.daemon.state.recovery import Restored, restore_partition
from vigil.daemon.state.store import Snapshot, SnapshotStore

__all__ = ["Restored", "Snapshot", "SnapshotStore", "restore_partition"]
