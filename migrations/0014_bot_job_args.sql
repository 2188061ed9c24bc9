-- Bot jobs keep their typed arguments (app.domain.jobs), so a re-run reads them back, and the time their
-- latest attempt started, so /metrics can export how long jobs run. The merge job splits into the fan-out
-- 'merge' and the per-project 'apply_project'.
ALTER TABLE bot_jobs ADD COLUMN args jsonb NOT NULL DEFAULT '{}';
ALTER TABLE bot_jobs ADD COLUMN started_at timestamptz;
UPDATE bot_jobs SET started_at = updated_at WHERE status <> 'queued';

UPDATE bot_jobs SET kind = CASE WHEN project = '' THEN 'merge' ELSE 'apply_project' END WHERE kind = 'merge_apply';

-- The arguments of the rows written before, from the columns (and the results) that held them.
UPDATE bot_jobs SET args = jsonb_build_object('repo', repo, 'number', coalesce(number, 0), 'head_sha', sha)
 WHERE kind IN ('pull_request', 'plan_preview', 'pull_request_review');
UPDATE bot_jobs SET args = jsonb_build_object('repo', repo, 'number', coalesce(number, 0))
 WHERE kind = 'pull_request_closed';
UPDATE bot_jobs SET args = jsonb_build_object('repo', repo, 'number', coalesce(number, 0), 'merge_sha', sha)
 WHERE kind = 'merge';
UPDATE bot_jobs SET args = jsonb_build_object('repo', repo, 'after', sha,
                                              'before', coalesce(result ->> 'before', repeat('0', 40)))
 WHERE kind = 'push';
UPDATE bot_jobs AS child
   SET args = jsonb_build_object(
       'repo', child.repo, 'number', coalesce(child.number, 0), 'sha', child.sha, 'project', child.project,
       'base', coalesce((SELECT parent.result ->> 'base' FROM bot_jobs AS parent
                          WHERE parent.repo = child.repo AND parent.sha = child.sha AND parent.project = ''
                            AND parent.kind IN ('merge', 'push')
                            AND parent.number IS NOT DISTINCT FROM child.number
                          LIMIT 1), ''))
 WHERE child.kind = 'apply_project';
UPDATE bot_jobs SET args = jsonb_build_object('repo', repo, 'project', project,
                                              'window', coalesce((result -> 'drift' ->> 'window')::bigint, 0),
                                              'sha', sha, 'branch', coalesce(result -> 'drift' ->> 'branch', ''))
 WHERE kind = 'drift_check';
