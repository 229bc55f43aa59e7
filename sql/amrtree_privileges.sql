--
-- amrtree_privileges: who may call which function, row-level security,
-- the locks the inspection functions take, and argument and option
-- checking (budgets, NULL arguments, partitioned indexes, tablespaces).
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree;
RESET client_min_messages;
CREATE TABLE priv_t (id int, owner text, b box);
INSERT INTO priv_t SELECT i, CASE WHEN i <= 5 THEN 'amr_limited' ELSE 'someone' END,
  box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 100) i;
CREATE INDEX priv_t_b ON priv_t USING amrtree (b);
CREATE ROLE amr_owner;
CREATE ROLE amr_limited;
CREATE ROLE amr_monitor;
GRANT SELECT ON priv_t TO amr_limited;

-- raw contents are for superusers, as pageinspect's functions are
SET ROLE amr_limited;
SELECT count(*) FROM amrtree_leaf_entries('priv_t_b');
SELECT count(*) FROM amrtree_leaf_table('priv_t_b');
-- shape and placement only need SELECT on the table
SELECT leaves > 0 AS has_leaves, entries FROM amrtree_index_stats('priv_t_b');
SELECT tier, leaves >= 0 AS ok FROM amrtree_tier_stats('priv_t_b') ORDER BY tier;
SELECT promotions >= 0 AS ok FROM amrtree_migration_stats('priv_t_b');
-- checking (it holds the index's inserts) and moving leaves need
-- ownership of the index
SELECT amrtree_check('priv_t_b');
SELECT amrtree_settle('priv_t_b', 0);
-- cluster-wide monitoring: pg_monitor, through GRANT
SELECT count(*) FROM amrtree_pool_stats();
SELECT count(*) FROM amrtree_ssd_cache_stats();
RESET ROLE;

-- an administrator may delegate, and the grants are honoured
GRANT EXECUTE ON FUNCTION amrtree_pool_stats() TO amr_monitor;
GRANT EXECUTE ON FUNCTION amrtree_leaf_entries(regclass) TO amr_limited;
SET ROLE amr_monitor;
SELECT indexes > 0 AS sees_pool FROM amrtree_pool_stats();
RESET ROLE;
GRANT pg_monitor TO amr_monitor;
SET ROLE amr_monitor;
SELECT size_bytes >= 0 AS sees_cache FROM amrtree_ssd_cache_stats();
RESET ROLE;
REVOKE EXECUTE ON FUNCTION amrtree_pool_stats() FROM pg_monitor;
SET ROLE amr_monitor;
-- still granted directly
SELECT indexes > 0 AS sees_pool FROM amrtree_pool_stats();
RESET ROLE;
REVOKE EXECUTE ON FUNCTION amrtree_pool_stats() FROM amr_monitor;
SET ROLE amr_monitor;
SELECT indexes > 0 AS sees_pool FROM amrtree_pool_stats();
RESET ROLE;
GRANT EXECUTE ON FUNCTION amrtree_pool_stats() TO pg_monitor;

-- with EXECUTE granted, raw entries still need SELECT on the table ...
SET ROLE amr_limited;
SELECT count(*) AS entries_seen FROM amrtree_leaf_entries('priv_t_b');
RESET ROLE;
-- ... and are refused where row-level security applies to the caller
ALTER TABLE priv_t ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON priv_t FOR SELECT USING (owner = current_user);
SET ROLE amr_limited;
SELECT count(*) AS rows_visible FROM priv_t WHERE b && box '((0,0),(200,200))';
SELECT count(*) FROM amrtree_leaf_entries('priv_t_b');
-- counts do not bypass it either way: the same as pg_class.reltuples shows
SELECT entries FROM amrtree_index_stats('priv_t_b');
RESET ROLE;
-- superusers bypass row-level security, as they do for the table
SELECT count(*) AS superuser_entries FROM amrtree_leaf_entries('priv_t_b');
ALTER TABLE priv_t DISABLE ROW LEVEL SECURITY;
DROP POLICY own_rows ON priv_t;
REVOKE EXECUTE ON FUNCTION amrtree_leaf_entries(regclass) FROM amr_limited;

-- the owner of the index may settle it
ALTER TABLE priv_t OWNER TO amr_owner;
SET ROLE amr_owner;
SELECT amrtree_settle('priv_t_b', 0) >= 0 AS settled;
-- an owner who is not a superuser checks the index's tree, not the pool
SELECT amrtree_check('priv_t_b');
RESET ROLE;
ALTER TABLE priv_t OWNER TO CURRENT_USER;

-- amrtree_check takes the lock a query takes, nothing stronger
BEGIN;
SELECT amrtree_check('priv_t_b');
SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'priv_t%' ORDER BY 1, 2;
COMMIT;

-- NULL arguments: the functions are strict
SELECT amrtree_settle(NULL);
SELECT amrtree_settle('priv_t_b', NULL);
SELECT amrtree_check(NULL), amrtree_index_stats(NULL);
-- and wrong relations are named
SELECT amrtree_check('priv_t');
SELECT amrtree_check(0);
CREATE INDEX priv_t_gist ON priv_t USING gist (b);
SELECT amrtree_check('priv_t_gist');
DROP INDEX priv_t_gist;

-- budgets out of range are refused, never taken as 0
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (pmem_budget = '1e30MB');
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (pmem_budget = '17179869184TB');
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (pmem_budget = '1.8e19B');
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (pmem_budget = '1e400');
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (pmem_budget = 'NaN%');
ALTER INDEX priv_t_b SET (pmem_budget = '1e30MB');
-- the largest size that fits is accepted and reported as it is
ALTER INDEX priv_t_b SET (pmem_budget = '8388607TB');
SELECT count(*) FROM priv_t WHERE b && box '((0,0),(1,1))';
SELECT budget_bytes FROM amrtree_tier_stats('priv_t_b') WHERE tier = 'pmem';
ALTER INDEX priv_t_b RESET (pmem_budget);

-- GiST's fillfactor and buffering are accepted, with GiST's checks
CREATE INDEX priv_ff ON priv_t USING amrtree (b) WITH (fillfactor = 50, buffering = on);
SELECT leaves > (SELECT leaves FROM amrtree_index_stats('priv_t_b')) AS more_leaves
FROM amrtree_index_stats('priv_ff');
DROP INDEX priv_ff;
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (buffering = invalid_value);
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (fillfactor = 9);
CREATE INDEX priv_bad ON priv_t USING amrtree (b) WITH (fillfactor = 101);
ALTER INDEX priv_t_b SET (fillfactor = 40);
REINDEX INDEX priv_t_b;
SELECT amrtree_check('priv_t_b');
ALTER INDEX priv_t_b RESET (fillfactor);

-- SET TABLESPACE to where the index already is: a no-op, as in PostgreSQL
ALTER INDEX priv_t_b SET TABLESPACE pg_default;
ALTER INDEX ALL IN TABLESPACE pg_default SET TABLESPACE pg_default;
SELECT amrtree_check('priv_t_b');

-- a partitioned index has no tree of its own: the functions look at its
-- partitions' indexes
CREATE TABLE priv_p (id int, b box) PARTITION BY RANGE (id);
CREATE TABLE priv_p1 PARTITION OF priv_p FOR VALUES FROM (0) TO (500);
CREATE TABLE priv_p2 PARTITION OF priv_p FOR VALUES FROM (500) TO (1000);
CREATE TABLE priv_p3 PARTITION OF priv_p FOR VALUES FROM (1000) TO (2000)
  PARTITION BY RANGE (id);
CREATE TABLE priv_p3a PARTITION OF priv_p3 FOR VALUES FROM (1000) TO (2000);
INSERT INTO priv_p SELECT i, box(point(i, 0), point(i + 1, 1)) FROM generate_series(0, 1999) i;
CREATE INDEX priv_p_b ON priv_p USING amrtree (b);
SELECT amrtree_check('priv_p_b');
SELECT p.entries, p.entries = c.entries AS entries_summed, p.leaves = c.leaves AS leaves_summed
FROM amrtree_index_stats('priv_p_b') p,
     (SELECT sum(s.entries) AS entries, sum(s.leaves) AS leaves
      FROM unnest(ARRAY['priv_p1_b_idx', 'priv_p2_b_idx', 'priv_p3a_b_idx']::regclass[]) i,
           amrtree_index_stats(i) s) c;
SELECT count(*) FROM amrtree_leaf_entries('priv_p_b');
SELECT tier, leaves > 0 AS has_leaves FROM amrtree_tier_stats('priv_p_b') WHERE tier = 'pmem';
SELECT amrtree_settle('priv_p_b', 0) >= 0 AS settled;
SET enable_seqscan = off;
SELECT count(*) FROM priv_p WHERE b && box '((100,0),(1500,1))';
RESET enable_seqscan;
-- amrtree_settle through a partitioned index skips the partitions whose
-- index the caller does not own, as VACUUM skips their tables (it moved
-- their leaves)
ALTER TABLE priv_p OWNER TO amr_owner;
ALTER TABLE priv_p1 OWNER TO amr_owner;
ALTER TABLE priv_p3 OWNER TO amr_owner;
ALTER TABLE priv_p3a OWNER TO amr_owner;
SET ROLE amr_owner;
SELECT amrtree_settle('priv_p_b', 0) >= 0 AS settled;
SELECT amrtree_settle('priv_p2_b_idx', 0);
RESET ROLE;
-- a partitioned index without partitions
CREATE TABLE priv_empty_parent (id int, b box) PARTITION BY RANGE (id);
CREATE INDEX priv_empty_b ON priv_empty_parent USING amrtree (b);
SELECT * FROM amrtree_index_stats('priv_empty_b');
SELECT amrtree_check('priv_empty_b');

DROP TABLE priv_p, priv_empty_parent, priv_t;
DROP ROLE amr_owner;
DROP ROLE amr_limited;
DROP ROLE amr_monitor;
