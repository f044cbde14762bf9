"""One file per transport; the interface they share and the factory are in labkit.sync.transport."""
