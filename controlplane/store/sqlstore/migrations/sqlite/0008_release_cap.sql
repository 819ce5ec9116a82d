-- K7: releases and declines of a job are counted (release_count, with the
-- class of the last in release_class) and capped; a released job waits out
-- its release backoff until not_before (Unix ns; 0 = at once). The claim's
-- ordered walk of its indexes passes a job in backoff, so a job that
-- cannot launch never stands in front of other conversations' turns.

ALTER TABLE jobs ADD COLUMN release_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN release_class TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN not_before INTEGER NOT NULL DEFAULT 0;
