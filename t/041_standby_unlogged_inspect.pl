# amrtree's SQL functions on a hot standby, given the index of an unlogged
# table: a standby has no main fork for unlogged relations (only their init
# fork), and amrtree logs nothing for their leaves, so there is no tree to
# read.  Each function must refuse such an index with the error PostgreSQL
# itself gives for unlogged relations during recovery, not fail with
# "could not open file ... No such file or directory" on the missing
# metapage (the randomized fuzzer, test/fuzz/amr_fuzz.py, found this with
# amrtree_check after a crash).  A partitioned index with an unlogged
# partition is refused the same way, naming the partition's index.  The
# primary, and the standby's logged indexes, are unaffected.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $primary = amr_node('primary', init => { allows_streaming => 1 }, conf => q{
autovacuum = off
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION amrtree');
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'standby');
$standby->start;

$primary->safe_psql('postgres', q{
CREATE UNLOGGED TABLE u (id int, b box);
INSERT INTO u SELECT g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 500) g;
CREATE INDEX u_b ON u USING amrtree (b);
CREATE TABLE l (id int, b box);
INSERT INTO l SELECT g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 500) g;
CREATE INDEX l_b ON l USING amrtree (b);
CREATE TABLE pt (id int, b box) PARTITION BY RANGE (id);
CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (1000);
CREATE UNLOGGED TABLE pt2 PARTITION OF pt FOR VALUES FROM (1000) TO (2000);
INSERT INTO pt SELECT g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 1999) g;
CREATE INDEX pt_b ON pt USING amrtree (b);
});
$primary->wait_for_catchup($standby);

my @calls = (
	q{SELECT amrtree_check('%s')},
	q{SELECT * FROM amrtree_index_stats('%s')},
	q{SELECT * FROM amrtree_tier_stats('%s')},
	q{SELECT * FROM amrtree_migration_stats('%s')},
	q{SELECT count(*) FROM amrtree_leaf_table('%s')},
	q{SELECT count(*) FROM amrtree_leaf_entries('%s')},
);

foreach my $call (@calls)
{
	foreach my $idx ('u_b', 'pt_b')
	{
		my $part = $idx eq 'pt_b' ? 'pt2_b_idx' : $idx;
		my $sql = sprintf($call, $idx);
		my ($ret, $out, $err) = $standby->psql('postgres', $sql);
		isnt($ret, 0, "standby refuses: $sql");
		unlike($err, qr/could not open file/, "no missing-file error: $sql");
		like($err,
			qr/cannot access unlogged index "$part" during recovery/,
			"says why: $sql")
		  or diag($err);
	}

	# a logged index on the standby, and both on the primary, still work
	my $sql = sprintf($call, 'l_b');
	my ($ret, $out, $err) = $standby->psql('postgres', $sql);
	is($ret, 0, "standby, logged index: $sql") or diag($err);
	foreach my $idx ('u_b', 'pt_b')
	{
		$sql = sprintf($call, $idx);
		($ret, $out, $err) = $primary->psql('postgres', $sql);
		is($ret, 0, "primary: $sql") or diag($err);
	}
}

# queries on the standby: PostgreSQL's own refusal, and the logged index
my ($ret, $out, $err) = $standby->psql('postgres',
	q{SELECT count(*) FROM u WHERE b && '((1,1),(10,10))'});
like($err, qr/cannot access temporary or unlogged relations during recovery/,
	'queries on the unlogged table are refused by PostgreSQL');
is( $standby->safe_psql('postgres',
		q{SET enable_seqscan = off; SELECT count(*) FROM l WHERE b && '((1,1),(10,10))'}),
	'10',
	'the logged index answers on the standby');

done_testing();
