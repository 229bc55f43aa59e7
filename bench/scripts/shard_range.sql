-- Range query returning the rows: a window of half-size :hw x :hh centred on
-- a random data box, sent as a literal (the centre is fetched first, as an
-- application that knows its window would send it).  For bench/shards, where
-- :tbl is a local table on a single server or a table partitioned over
-- postgres_fdw shards.  Rows, not count(*): over several foreign partitions
-- an aggregate is computed on the coordinator, over one it is shipped, so a
-- count would not compare like with like.  Variables: tbl, n, hw, hh.
\set k random(1, :n)
SELECT x - :hw AS x0, y - :hh AS y0, x + :hw AS x1, y + :hh AS y1 FROM bench_centers WHERE id = :k \gset
SELECT id, b FROM :tbl WHERE b && box(point(:x0, :y0), point(:x1, :y1));
