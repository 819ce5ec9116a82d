-- The fence of every fenced write of an attempt (P1), on the attempts row
-- named attempts and the item r (r.gen its lease generation, r.now the time
-- it is judged at, in Unix nanoseconds): the attempt's current generation,
-- running, and a live lease (K3). A lease that expired inside the control
-- plane's own absence that no sweep has resumed yet is live: the absence is
-- control_plane.last_seen, older than the gap the last sweep named (P4).
attempts.generation = r.gen AND attempts.state = 'running' AND (attempts.lease_expires_at > r.now
	OR attempts.lease_expires_at > (SELECT cp.last_seen FROM control_plane cp
		WHERE cp.id = 1 AND cp.max_gap > 0 AND cp.last_seen < r.now - cp.max_gap))
