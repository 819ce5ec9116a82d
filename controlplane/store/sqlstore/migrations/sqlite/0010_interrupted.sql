-- K10: a settlement may record an interrupted boundary (the user's cancel
-- stopped the agent at the supervisor, which settled where it stopped).
-- settled_interrupted is 1 on such an attempt: its job ends cancelled and
-- its conversation continues from that boundary.

ALTER TABLE attempts ADD COLUMN settled_interrupted INTEGER NOT NULL DEFAULT 0;
