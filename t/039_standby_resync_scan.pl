# A standby scan that is running while the standby replays the whole
# images that a primary's crash recovery logs again ("resync",
# amr_reconcile.c) must still return every committed row.
#
# A transaction on the primary splits a leaf and the primary crashes before
# the split's record reached the disk.  The split stays in the primary's
# pool, so recovery logs both halves again, whole, one record per leaf.  A
# standby that had not seen the split replays them: the first half's image
# replaces the old full leaf, and the second half is a leaf it never had.
# A plain index scan on the standby that collected its leaves before that
# (a cursor fetched from once) and reads the first half after it must
# still find the entries that the split moved to the second half -- or be
# canceled by a recovery conflict.  (It used to miss them: 73 rows of 120
# on PMEM.)  On SSD the pruning rewrites the halves, logged the same way.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# no WAL may reach the disk behind the dying transaction's back
my $primary = amr_lost_wal_primary();
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'standby');
$standby->append_conf('postgresql.conf', q{
max_standby_streaming_delay = 1s
});
$standby->start;

# One lost split, on a $tier leaf of a new index on table $tab (created
# after the backup: the standby's own pool gets the tree from the WAL).
sub lost_split
{
	my ($tier, $tab, $options) = @_;

	$primary->safe_psql('postgres', qq{
CREATE TABLE $tab (id int, b box);
CREATE INDEX ${tab}_b ON $tab USING amrtree (b)$options;});
	# two leaves of 60 entries, far apart: ids 1..60 near (0,0), 1001..1060
	# near (1000,1000)
	$primary->safe_psql('postgres', qq{
	INSERT INTO $tab SELECT g, box(point(g * 0.5, g * 0.5), point(g * 0.5 + 0.25, g * 0.5 + 0.25))
	  FROM generate_series(1, 60) g;
	INSERT INTO $tab SELECT 1000 + g, box(point(1000 + g * 0.5, 1000 + g * 0.5), point(1000 + g * 0.5 + 0.25, 1000 + g * 0.5 + 0.25))
	  FROM generate_series(1, 60) g;
	INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
	CHECKPOINT;});
	my $nleaves = $primary->safe_psql('postgres', qq{SELECT leaves FROM amrtree_index_stats('${tab}_b')});
	cmp_ok($nleaves, '>=', 2, "$tier: the index has at least two leaves");
	$primary->wait_for_catchup($standby);

	my $window = q{box '((-1,-1),(2000,2000))'};

	# the standby's scan: one row fetched, so its leaves are collected and the
	# first one read
	my ($sin, $sout) = ('', '');
	my $scan = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $standby->connstr('postgres'), '-f', '-' ],
		'<', \$sin, '>', \$sout, '2>&1',
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	$sin .= qq{
	BEGIN ISOLATION LEVEL REPEATABLE READ;
	SET enable_seqscan = off;
	SET enable_bitmapscan = off;
	EXPLAIN (COSTS OFF) SELECT id FROM $tab WHERE b && $window;
	DECLARE c CURSOR FOR SELECT id FROM $tab WHERE b && $window;
	FETCH 1 FROM c;
	SELECT 'fetched';
	};
	$scan->pump until $sout =~ /fetched/ || $sout =~ /ERROR/;
	like($sout, qr/Index Scan using ${tab}_b/, "$tier: the standby cursor is a plain amrtree index scan");
	my ($first) = $sout =~ /^(\d+)\nfetched/m;
	ok(defined $first, "$tier: the standby cursor returned its first row") or diag $sout;
	$sout = '';

	# the primary: a transaction, left open, splits the leaf that the scan has
	# not read yet; nothing of it is flushed
	my $target = $first > 1000 ? 0 : 1000;
	my ($in, $out) = ('', '');
	my $open_tx = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $primary->connstr('postgres'), '-f', '-' ],
		'<', \$in, '>', \$out, '2>&1',
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	$in .= qq{
	BEGIN;
	INSERT INTO $tab SELECT 5000 + g, box(point($target + g * 0.5 + 0.1, $target + g * 0.5 + 0.1),
	  point($target + g * 0.5 + 0.2, $target + g * 0.5 + 0.2)) FROM generate_series(1, 40) g;
	SELECT 'inserted';
	};
	$open_tx->pump until $out =~ /inserted/ || $out =~ /ERROR/;
	is($out, "inserted\n", "$tier: a transaction inserted 40 rows and stays open");
	cmp_ok($primary->safe_psql('postgres', qq{SELECT leaves FROM amrtree_index_stats('${tab}_b')}),
		'>', $nleaves, "$tier: the insert split a leaf");

	my $log_at = -s $primary->logfile;
	$primary->stop('immediate');
	$open_tx->kill_kill;
	$primary->start;
	is($primary->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM $tab WHERE b && $window"),
		120, "$tier: primary: the index finds the committed rows, not the lost ones");
	ok($primary->wait_for_log(qr/were logged again, whole/, $log_at),
		"$tier: recovery logged the changed leaves again, whole");
	$primary->wait_for_catchup($standby);

	# the standby's scan goes on, in the same snapshot as before
	$sin .= qq{
	FETCH ALL FROM c;
	SELECT 'all';
	SET enable_seqscan = on;
	SET enable_indexscan = off;
	SELECT 'seq ' || count(*) FROM $tab WHERE b && $window;
	COMMIT;
	SELECT 'done';
	\\q
	};
	$scan->finish;
	if ($sout =~ /conflict with recovery/)
	{
		pass("$tier: standby: the scan that began before the whole images was canceled by a recovery conflict");
	}
	else
	{
		my ($rest) = $sout =~ /^(.*?)all\n/s;
		my @ids = defined $rest ? split(/\n/, $rest) : ();
		my ($seq) = $sout =~ /^seq (\d+)$/m;
		my %seen;
		$seen{$_}++ for ($first, @ids);
		ok(defined $seq && $seq == 120 && 1 + scalar(@ids) == 120
			  && !grep({ $seen{$_} > 1 } keys %seen),
			"$tier: standby: the scan that began before the whole images returns every committed row once, "
			  . 'as a sequential scan in its snapshot does')
		  or diag "index scan: " . (1 + scalar(@ids)) . " rows; " . ($seq ? "seq $seq" : $sout);
	}
	is($standby->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM $tab WHERE b && $window"),
		120, "$tier: standby: a new index scan returns every committed row");

	return;
}

lost_split('PMEM', 's', '');
# on SSD (a budget below one leaf), the pruning rewrites the halves
lost_split('SSD', 'm', " WITH (pmem_budget = '1kB')");

$standby->stop('immediate');
$primary->stop('immediate');
done_testing();
