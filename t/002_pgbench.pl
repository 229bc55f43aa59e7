# Concurrency under load: pgbench clients inserting, deleting and running
# range queries (index, bitmap and index-only scans) for 45 seconds while
# another session vacuums in a loop; some of the queries compare, in one
# REPEATABLE READ snapshot, each kind of index scan with a sequential scan
# (a disagreement fails the transaction).  Afterwards the index agrees with
# a sequential scan for every strategy and amrtree_check holds.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $duration = $ENV{AMR_PGBENCH_SECONDS} || 45;
my $node = amr_node('pgbench', conf => "max_connections = 30\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
amr_load_porto($node, 'trips', 30000, 11);
$node->safe_psql('postgres', q{
CREATE SEQUENCE trip_ids START 1000000;
CREATE INDEX trips_b ON trips USING amrtree (b);
VACUUM ANALYZE trips;
});
amr_setup_snapshot_checks($node);

my $dir = PostgreSQL::Test::Utils::tempdir();
my %scripts = (
	'insert.sql' => q{
\set x random(0, 1200)
\set y random(0, 900)
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.68 + :x * 0.0001, 41.10 + :y * 0.0001),
                               point(-8.68 + :x * 0.0001 + random() * 0.002, 41.10 + :y * 0.0001 + random() * 0.001)), 0;
},
	'query.sql' => q{
\set x random(0, 1200)
\set y random(0, 900)
SELECT count(*) FROM trips
WHERE b && box(point(-8.68 + :x * 0.0001, 41.10 + :y * 0.0001), point(-8.68 + :x * 0.0001 + 0.004, 41.10 + :y * 0.0001 + 0.003));
},
	'query_rows.sql' => q{
\set x random(0, 1200)
\set y random(0, 900)
BEGIN;
SET LOCAL enable_bitmapscan = off;
SELECT id, b FROM trips
WHERE b <@ box(point(-8.68 + :x * 0.0001, 41.10 + :y * 0.0001), point(-8.68 + :x * 0.0001 + 0.01, 41.10 + :y * 0.0001 + 0.006));
COMMIT;
},
	# plain, index-only and bitmap scans against a sequential scan, in one
	# snapshot, while VACUUM, splits and deletes go on
	'check.sql' => q{
\set x random(0, 1200)
\set y random(0, 900)
\set o random(0, 3)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT amr_check_window('trips', box(point(-8.68 + :x * 0.0001, 41.10 + :y * 0.0001),
  point(-8.68 + :x * 0.0001 + 0.004, 41.10 + :y * 0.0001 + 0.003)), (ARRAY['&&', '&&', '@>', '<@'])[:o + 1]);
COMMIT;
},
	'delete.sql' => q{
\set id random(1, 1100000)
DELETE FROM trips WHERE id = :id;
},);
while (my ($f, $sql) = each %scripts)
{
	open my $fh, '>', "$dir/$f" or die;
	print $fh $sql;
	close $fh;
}

my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[
		'pgbench', '-n', '-c', '4', '-j', '2', '-T', $duration,
		'-f', "$dir/insert.sql\@5", '-f', "$dir/query.sql\@3",
		'-f', "$dir/query_rows.sql\@2", '-f', "$dir/check.sql\@2", '-f', "$dir/delete.sql\@1",
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'>', \$out, '2>', \$err);

# vacuum in a loop while the clients run
my $vacuums = 0;
my $vac = $node->background_psql('postgres');
while ($bench->pumpable)
{
	$vac->query_safe('VACUUM trips');
	$vacuums++;
	sleep 1;
	$bench->pump_nb;
}
my $bench_ok = $bench->finish;
$vac->quit;

note $out;
ok($bench_ok, 'pgbench succeeded') or diag $err;
like($out, qr/number of failed transactions: 0 /, 'no transaction failed');
my ($tx) = $out =~ /number of transactions actually processed: (\d+)/;
cmp_ok($tx // 0, '>', 1000, "clients got work done ($tx transactions)");
cmp_ok($vacuums, '>', 5, "VACUUM ran $vacuums times during the run");

# INDEX_CLEANUP ON: by default VACUUM may leave a few dead line pointers and
# their index entries for later when they are on under 2% of the pages
$node->safe_psql('postgres', 'VACUUM (INDEX_CLEANUP ON) trips');
is($node->safe_psql('postgres', q{SELECT amrtree_check('trips_b')}), 't', 'amrtree_check after the run');

amr_setup_parity($node);
$node->safe_psql('postgres', q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT g, box(point(-8.68 + (g % 8) * 0.015, 41.10 + (g / 8) * 0.02),
              point(-8.68 + (g % 8) * 0.015 + 0.004, 41.10 + (g / 8) * 0.02 + 0.003))
FROM generate_series(0, 31) g;
});
my ($mismatch, $rows) = amr_parity_mismatches($node, 'trips');
is($mismatch, 0, "index agrees with a sequential scan for every strategy ($rows rows matched)");
is($node->safe_psql('postgres', 'SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips'),
	$node->safe_psql('postgres', 'SELECT count(*) FROM trips'),
	'an index-only scan counts exactly the heap rows');
# Autovacuum is off, so nothing holds the xmin horizon back: an exact match
# also shows that none of the concurrent VACUUMs left an entry behind for a
# heap tuple it removed.
is($node->safe_psql('postgres', 'SELECT entries FROM amrtree_index_stats(\'trips_b\')'),
	$node->safe_psql('postgres', 'SELECT count(*) FROM trips'),
	'after VACUUM the index holds exactly one entry per row')
  or amr_diag_extra_entries($node, 'trips', 'trips_b');

$node->stop;
done_testing();
