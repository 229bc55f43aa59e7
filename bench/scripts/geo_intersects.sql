-- PostGIS ST_Intersects with no && written: PostGIS's planner support adds
-- the index condition (for amrtree through its GiST twin, src/amr_plan.c).
-- Variables (pgbench -D): tbl (table with column g geometry), n (rows in
-- bench_centers), hw, hh.  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM :tbl
WHERE ST_Intersects(g, (SELECT ST_MakeEnvelope(x - :hw, y - :hh, x + :hw, y + :hh) FROM bench_centers WHERE id = :k));
