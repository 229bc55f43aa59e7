-- A hot region: windows centred uniformly on the first :nhot centres only.
-- Variables as range.sql, plus nhot.
\set k random(1, :nhot)
SELECT count(*) FROM :tbl
WHERE b && (SELECT box(point(x - :hw, y - :hh), point(x + :hw, y + :hh))
            FROM bench_centers WHERE id = :k);
