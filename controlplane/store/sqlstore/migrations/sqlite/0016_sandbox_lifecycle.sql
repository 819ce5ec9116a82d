-- Sandbox lifecycle (issue 21). conversations.sandbox_state is the state
-- of the conversation's retained sandbox as the host holding it last
-- reported it: 'running', 'stopped' (evicted idle or under pressure, S1,
-- S2; its next turn starts it again), '' while none is recorded. A turn
-- that records its sandbox makes it 'running'. hosts.sandbox_pressure is
-- the host's last report that it is short of disk or memory and withholds
-- first turns (S2): the JSON of wire.SandboxPressure, '' when it is not.

ALTER TABLE conversations ADD COLUMN sandbox_state TEXT NOT NULL DEFAULT '';
UPDATE conversations SET sandbox_state = 'running' WHERE sandbox_host_id IS NOT NULL;
ALTER TABLE hosts ADD COLUMN sandbox_pressure TEXT NOT NULL DEFAULT '';
