--
-- amrtree_basic: the access method, its operator class, simple use, and the
-- errors users meet.
--
CREATE EXTENSION amrtree;

-- the operator class validates
SELECT opcname, amvalidate(opc.oid)
FROM pg_opclass opc JOIN pg_am am ON am.oid = opc.opcmethod
WHERE am.amname = 'amrtree';

-- same strategy numbers and operators as GiST's box_ops
SELECT a.amopstrategy, a.amopopr::regoperator, a.amopopr = g.amopopr AS same_as_gist
FROM pg_amop a
JOIN pg_opclass ac ON ac.opcfamily = a.amopfamily AND ac.opcname = 'box_ops'
JOIN pg_am aam ON aam.oid = ac.opcmethod AND aam.amname = 'amrtree'
LEFT JOIN (SELECT g.amopstrategy, g.amopopr
           FROM pg_amop g
           JOIN pg_opclass gc ON gc.opcfamily = g.amopfamily AND gc.opcname = 'box_ops'
           JOIN pg_am gam ON gam.oid = gc.opcmethod AND gam.amname = 'gist') g
  ON g.amopstrategy = a.amopstrategy
ORDER BY 1;

-- what the access method can and cannot do
SELECT p, pg_indexam_has_property(am.oid, p)
FROM pg_am am,
     unnest(ARRAY['can_order', 'can_unique', 'can_multi_col', 'can_exclude', 'can_include']) p
WHERE am.amname = 'amrtree';

-- an index on an empty table, then rows arriving one by one
CREATE TABLE empty_t (id int, b box);
CREATE INDEX empty_t_b ON empty_t USING amrtree (b);
SELECT * FROM empty_t WHERE b && box '((0,0),(1,1))';
SELECT amrtree_check('empty_t_b');
SELECT height, leaves, entries FROM amrtree_index_stats('empty_t_b');
SELECT pg_relation_size('empty_t_b') > 0 AS has_metapage;
INSERT INTO empty_t VALUES (1, box '((0,0),(1,1))'), (2, NULL), (3, box '((5,5),(5,5))');
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM empty_t WHERE b && box '((0.5,0.5),(2,2))';
SELECT id FROM empty_t WHERE b && box '((0.5,0.5),(2,2))';
EXPLAIN (COSTS OFF) SELECT id FROM empty_t WHERE b IS NULL;
SELECT id FROM empty_t WHERE b IS NULL;
SELECT id FROM empty_t WHERE b IS NOT NULL ORDER BY id;
SELECT id FROM empty_t WHERE b ~= box '((5,5),(5,5))';
-- a NULL comparison value matches nothing (the operators are strict)
SELECT id FROM empty_t WHERE b && NULL::box;
RESET enable_seqscan;
SELECT amrtree_check('empty_t_b');
SELECT height, leaves, entries FROM amrtree_index_stats('empty_t_b');
SELECT entry, tid, key, dead FROM amrtree_leaf_entries('empty_t_b') ORDER BY tid;

-- boxes with NaN coordinates are stored, as GiST stores them (the NaN
-- side of their bounding box is infinite; amrtree_nan tests the answers)
INSERT INTO empty_t VALUES (4, box '((NaN,0),(1,1))');
SELECT count(*) FROM empty_t;
SELECT entries FROM amrtree_index_stats('empty_t_b');
SELECT amrtree_check('empty_t_b');
-- ... and built
CREATE TABLE nan_t (b box);
INSERT INTO nan_t VALUES (box '((0,0),(1,NaN))');
CREATE INDEX nan_t_b ON nan_t USING amrtree (b);
SELECT amrtree_check('nan_t_b');
-- a NaN query is answered like a sequential scan answers it
INSERT INTO empty_t SELECT 100 + i, box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 300) i;
CREATE TABLE nan_q (op text, q box);
INSERT INTO nan_q SELECT op, q
FROM unnest(ARRAY['<<','&<','&&','&>','>>','~=','@>','<@','&<|','<<|','|>>','|&>']) op,
     unnest(ARRAY[box '((NaN,0),(1,1))', box '((NaN,NaN),(NaN,NaN))', box '((0,0),(NaN,2))']) q;
CREATE FUNCTION ids_where(op text, q box, use_index bool) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE r int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  EXECUTE format('SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM empty_t WHERE b %s $1', op)
    INTO r USING q;
  RETURN r;
END $$;
SELECT count(*) AS nan_queries,
       count(*) FILTER (WHERE ids_where(op, q, true) <> ids_where(op, q, false)) AS mismatches,
       sum(cardinality(ids_where(op, q, false))) AS rows_matched
FROM nan_q;
DELETE FROM empty_t WHERE id > 100;

-- what is not supported, and says so
CREATE INDEX ON empty_t USING amrtree (b) WITH (pages_per_range = 4);
CREATE TABLE two_boxes (a box, b box);
CREATE INDEX ON two_boxes USING amrtree (a, b);
CREATE UNIQUE INDEX ON two_boxes USING amrtree (a);
-- INCLUDE columns are accepted (covering indexes move over from GiST) but
-- not stored: a query that reads them fetches the heap, one that reads
-- only the key may still scan the index alone
CREATE INDEX two_boxes_cover ON two_boxes USING amrtree (a) INCLUDE (b);
INSERT INTO two_boxes SELECT box(point(i, i), point(i + 1, i + 1)), box(point(-i, -i), point(0, 0))
FROM generate_series(1, 200) i;
VACUUM ANALYZE two_boxes;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT a, b FROM two_boxes WHERE a && box '((10,10),(12,12))';
SELECT a, b FROM two_boxes WHERE a && box '((10,10),(12,12))' ORDER BY (a[0])[0];
EXPLAIN (COSTS OFF) SELECT a FROM two_boxes WHERE a && box '((10,10),(12,12))';
SELECT a FROM two_boxes WHERE a && box '((10,10),(12,12))' ORDER BY (a[0])[0];
SELECT b FROM two_boxes ORDER BY a <-> point '(50.5,50.2)' LIMIT 2;
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT amrtree_check('two_boxes_cover');
-- column properties as GiST reports them: distance_orderable where the
-- operator class has an ordering operator; an INCLUDE column has none
SELECT a.attname, p, pg_index_column_has_property('two_boxes_cover'::regclass, a.attnum, p)
FROM pg_attribute a, unnest(ARRAY['distance_orderable', 'returnable', 'orderable']) p
WHERE a.attrelid = 'two_boxes_cover'::regclass ORDER BY a.attnum, p;
CREATE TABLE points (p point);
-- a type without an operator class
CREATE TABLE segments (s lseg);
CREATE INDEX ON segments USING amrtree (s);
DROP TABLE segments;
-- expression indexes work
CREATE INDEX points_box ON points USING amrtree (box(p, p));
INSERT INTO points SELECT point(i, i) FROM generate_series(1, 10) i;
SET enable_seqscan = off;
SELECT p FROM points WHERE box(p, p) <@ box '((2,2),(4,4))' ORDER BY p[0];
RESET enable_seqscan;
SELECT amrtree_check('points_box');

-- exclusion constraints work through the index
CREATE TABLE bookings (room int, area box, EXCLUDE USING amrtree (area WITH &&));
INSERT INTO bookings VALUES (1, box '((0,0),(1,1))'), (2, box '((2,2),(3,3))');
INSERT INTO bookings VALUES (3, box '((0.5,0.5),(2.5,2.5))');
INSERT INTO bookings VALUES (3, box '((5,5),(6,6))');
SELECT room FROM bookings ORDER BY room;

-- a transaction that creates an amrtree index cannot be prepared
BEGIN;
CREATE INDEX two_boxes_a ON two_boxes USING amrtree (a);
PREPARE TRANSACTION 'amr';
SELECT count(*) FROM pg_indexes WHERE indexname = 'two_boxes_a';

-- unlogged tables are supported
CREATE UNLOGGED TABLE unlogged_t (b box);
INSERT INTO unlogged_t SELECT box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 1000) i;
CREATE INDEX unlogged_t_b ON unlogged_t USING amrtree (b);
SET enable_seqscan = off;
SELECT count(*) FROM unlogged_t WHERE b && box '((10,10),(20,20))';
RESET enable_seqscan;
SELECT amrtree_check('unlogged_t_b');

-- the inspection functions
SELECT amrtree_check('pg_class_oid_index');
SELECT amrtree_check('empty_t');
CREATE ROLE amr_reader;
SET ROLE amr_reader;
SELECT amrtree_check('empty_t_b');
SELECT * FROM amrtree_index_stats('empty_t_b');
SELECT * FROM amrtree_leaf_entries('empty_t_b');
SELECT * FROM amrtree_pool_stats();
RESET ROLE;
GRANT SELECT ON empty_t TO amr_reader;
SET ROLE amr_reader;
SELECT amrtree_check('empty_t_b');
SELECT height, leaves, entries FROM amrtree_index_stats('empty_t_b');
RESET ROLE;
REVOKE SELECT ON empty_t FROM amr_reader;
DROP ROLE amr_reader;
SELECT pmem_slots > 0 AS has_slots, dram_nodes > 0 AS has_dram FROM amrtree_pool_stats();

-- the planner uses the tree to tell small windows from large ones
CREATE TABLE grid (id int, b box);
INSERT INTO grid SELECT x * 1000 + y, box(point(x, y), point(x + 0.5, y + 0.5))
FROM generate_series(0, 199) x, generate_series(0, 199) y;
CREATE INDEX grid_b ON grid USING amrtree (b);
VACUUM ANALYZE grid;
EXPLAIN (COSTS OFF) SELECT id FROM grid WHERE b && box '((10,10),(12,12))';
EXPLAIN (COSTS OFF) SELECT id FROM grid WHERE b && box '((-1,-1),(300,300))';
EXPLAIN (COSTS OFF) SELECT count(*) FROM grid WHERE b && box '((10,10),(12,12))';
SELECT count(*) FROM grid WHERE b && box '((10,10),(12,12))';
-- idx_scan is counted
SELECT pg_stat_force_next_flush();
SELECT idx_scan > 0 AS counted FROM pg_stat_user_indexes WHERE indexrelname = 'grid_b';

-- a partial index holds only the rows its predicate admits, serves the
-- queries that imply it, and answers like a sequential scan
CREATE TABLE part_t (id int, b box, active bool);
INSERT INTO part_t SELECT g, box(point(g % 100, g / 100), point(g % 100 + 0.5, g / 100 + 0.5)), g % 3 = 0
FROM generate_series(0, 9999) g;
CREATE INDEX part_t_b ON part_t USING amrtree (b) WHERE active;
VACUUM ANALYZE part_t;
SELECT entries FROM amrtree_index_stats('part_t_b');
INSERT INTO part_t VALUES (10000, box '((5,5),(5.2,5.2))', true), (10001, box '((5,5),(5.2,5.2))', false);
SELECT entries FROM amrtree_index_stats('part_t_b');
CREATE FUNCTION part_ids(q box, use_index bool) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE r int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM part_t WHERE b && $1 AND active'
    INTO r USING q;
  RETURN r;
END $$;
SELECT cardinality(part_ids(box '((4,4),(10,10))', false)) AS rows_matched,
       part_ids(box '((4,4),(10,10))', true) = part_ids(box '((4,4),(10,10))', false) AS index_agrees;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM part_t WHERE b && box '((4,4),(10,10))' AND active;
-- a query that does not imply the predicate cannot use the index
EXPLAIN (COSTS OFF) SELECT id FROM part_t WHERE b && box '((4,4),(10,10))';
RESET enable_seqscan;
