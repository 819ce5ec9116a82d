-- Retention (P8): past the window, an ended job's bulky detail is
-- reclaimed and detail_reclaimed_at says when. jobs_reclaim holds only
-- ended jobs whose detail remains, in the order they ended, so a sweep
-- reads just what it reclaims.

ALTER TABLE jobs ADD COLUMN detail_reclaimed_at BIGINT;
CREATE INDEX jobs_reclaim ON jobs (ended_at) WHERE ended_at IS NOT NULL AND detail_reclaimed_at IS NULL;
