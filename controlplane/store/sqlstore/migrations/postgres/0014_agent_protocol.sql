-- A conversation names its agent's protocol: 'lines' (the prompt on stdin,
-- JSON lines out; every conversation before this one) or 'acp' (the Agent
-- Client Protocol), and for 'acp' how permission requests are answered.
ALTER TABLE conversations ADD COLUMN agent_protocol TEXT NOT NULL DEFAULT 'lines';
ALTER TABLE conversations ADD COLUMN permission_policy TEXT NOT NULL DEFAULT '';
