-- K8: the cluster identity, created with the database (the store inserts
-- the one row, a random id, in the transaction that migrates a new
-- database). Hosts pin it at first contact and remove no sandbox on the
-- word of a control plane whose identity differs: a new or wrongly
-- configured database then removes nothing.
CREATE TABLE cluster (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	cluster_id TEXT NOT NULL UNIQUE
);
