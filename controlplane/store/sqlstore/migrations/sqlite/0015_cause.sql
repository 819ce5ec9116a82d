-- S5: why a failed, cancelled or lost turn ended, from the closed list
-- (wire.Cause), and the evidence its runner read it from.
ALTER TABLE jobs ADD COLUMN cause TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN cause_evidence TEXT NOT NULL DEFAULT '';
