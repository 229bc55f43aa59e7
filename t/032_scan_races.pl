# A scan reading an SSD leaf that splits while the scan holds no lock.
#
# A scan reads a leaf's Leaf Table word and split links under the leaf's
# lock, and an SSD image after releasing it (the device read must not hold
# a lock).  If the word has changed by then, the leaf moved or was
# rewritten, and the scan reads it again.  It used to read only the new
# image then, without looking at the split links again: when the change was
# a split, the entries that moved to the new right leaf were never read,
# and a query returned too few rows (24 of 73 here).  Now it starts the
# read over, under the lock, and follows the right link like any scan that
# meets a leaf split after it started.
#
# The scan is paused at scan:before_ssd_read (amr_fault.c), after it let go
# of the lock and before the device read, while another session inserts
# into that leaf until it splits.  The SSD cache is off
# (amrtree.ssd_cache_size = 0), as if the image had been evicted, so the
# read goes to the device.  Each kind of scan (bitmap, plain, index-only,
# KNN) must return, in its REPEATABLE READ snapshot, exactly what a
# sequential scan returns in the same snapshot.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('scanrace', conf => q{
autovacuum = off
amrtree.ssd_cache_size = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
my $paused = $node->data_dir . '/amrtree_fault_paused';

# the window covers the second of four leaves, and only it
my $window = q{box '((0.76,-1),(1.48,1))'};
my %queries = (
	bitmap => [ 'enable_indexscan = off',
		"SELECT count(*) || ':' || sum(id) FROM r WHERE b && $window" ],
	plain => [ 'enable_bitmapscan = off',
		"SELECT string_agg(id::text, ',' ORDER BY id) FROM r WHERE b && $window" ],
	index_only => [ 'enable_bitmapscan = off',
		"SELECT count(*) || ':' || sum(hashtext(b::text)) FROM r WHERE b && $window" ],
	knn => [ 'enable_bitmapscan = off',
		q{SELECT string_agg(id::text, ',') FROM
		  (SELECT id FROM r ORDER BY b <-> point '(1.1013,0.0025)' LIMIT 60) s} ],);

for my $kind (sort keys %queries)
{
	my ($setting, $query) = @{ $queries{$kind} };

	# 300 rows in a line, packed 75 to a leaf, all demoted to SSD
	$node->safe_psql('postgres', q{
DROP TABLE IF EXISTS r;
CREATE TABLE r (id int, b box);
INSERT INTO r SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005))
FROM generate_series(0, 299) g;
CREATE INDEX r_b ON r USING amrtree (b) WITH (pmem_budget = '1B');
VACUUM ANALYZE r;
SELECT amrtree_settle('r_b', 0.5);});
	is( $node->safe_psql('postgres', qq{
SELECT count(*) || ' ' || min(tier) || ' ' || max(tier)
FROM amrtree_leaf_table('r_b') WHERE mbr && $window}),
		'1 ssd ssd', "$kind: the window's one leaf is on SSD");

	# the sequential scan fixes the snapshot; the index scan pauses
	my $scan = $node->background_psql('postgres');
	my $before = $scan->query_until(qr/armed/, qq{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT 'seq=' || ($query);
SET LOCAL enable_seqscan = off;
SET LOCAL enable_indexscan = on;
SET LOCAL enable_bitmapscan = on;
SET LOCAL $setting;
SET LOCAL amrtree.fault_injection = 'scan:before_ssd_read';
\\echo armed
SELECT 'index=' || ($query);
\\echo scanned
});
	my $waited = 0;
	usleep(50_000), $waited++ until -e $paused || $waited > 600;
	ok(-e $paused, "$kind: the scan paused before reading the SSD leaf");

	# 20 rows into that leaf: it splits
	$node->safe_psql('postgres', q{
INSERT INTO r SELECT 1000 + g, box(point(0.8 + g * 0.01, 0.001), point(0.8 + g * 0.01 + 0.002, 0.002))
FROM generate_series(0, 19) g;});
	cmp_ok($node->safe_psql('postgres', qq{
SELECT count(*) FROM amrtree_leaf_table('r_b') WHERE mbr && $window}),
		'>', 1, "$kind: the leaf split meanwhile");
	unlink $paused;

	my $out = $scan->query_until(qr/scanned/, '');
	$scan->query_safe('COMMIT');
	$scan->quit;
	my ($seq) = $before =~ /^seq=(.*)$/m;
	my ($index) = $out =~ /^index=(.*)$/m;
	ok(defined $seq && length $seq, "$kind: the sequential scan answered") or diag $before;
	is($index, $seq, "$kind: the index scan returns what the sequential scan returns in its snapshot");
}

like(slurp_file($node->logfile), qr/paused at "scan:before_ssd_read"/,
	'the pauses are in the log');
is($node->safe_psql('postgres', q{SELECT amrtree_check('r_b')}), 't', 'amrtree_check');

done_testing();
