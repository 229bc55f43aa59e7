-- shard_range.sql plus the predicate that b && w implies on a partition key
-- of the box's west edge, (b[1])[0]: no row can overlap the window if it
-- starts east of the window's east edge (plus a margin above the box
-- operators' 1e-6 fuzz).  The planner prunes the partitions whose range lies
-- east of the window.  Variables as shard_range.sql.
\set k random(1, :n)
SELECT x - :hw AS x0, y - :hh AS y0, x + :hw AS x1, y + :hh AS y1 FROM bench_centers WHERE id = :k \gset
SELECT id, b FROM :tbl WHERE b && box(point(:x0, :y0), point(:x1, :y1)) AND (b[1])[0] <= :x1 + 1e-5;
