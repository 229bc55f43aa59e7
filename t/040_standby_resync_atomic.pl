# A primary's crash recovery logs again, whole, every leaf that changed
# beyond the replayed WAL ("resync", amr_reconcile.c).  A standby must never
# be left with part of a tree's resync: a query that starts there between
# two of its records, and a standby promoted at that point, must return what
# a sequential scan returns.
#
# One transaction splits a PMEM leaf and an SSD leaf, the primary crashes
# before any of it reached the disk, and recovery logs the changed leaves
# again.  The standby (stopped meanwhile) replays up to and including the
# first resync record of the index with the most leaves logged again, and
# pauses there (recovery_target_lsn).  When each leaf went into a record of
# its own, the first half of the split had replaced the old full leaf there
# and the second half had not come: queries started at that point missed
# the rows that moved (94 rows of 120, on PMEM in one run and on SSD in
# another), also after the standby's restart, and so did the standby once
# promoted.  Now all of a tree's images travel in one record, whose replay
# standby scans see whole or not at all.
#
# Second part: past AMR_WAL_MAX_RESYNC_IMAGES a tree's resync goes in
# parts; a standby between two of them refuses the index, and rebuilds it
# if promoted there.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# no WAL may reach the disk behind the dying transaction's back
my $primary = amr_lost_wal_primary(conf => "wal_keep_size = 256MB\n",
	sql => 'CREATE EXTENSION pg_walinspect;');
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'standby');
$standby->start;
# for the second part, below
my $standby2 = amr_standby_own_pool($primary, 'b', 'standby2');

# Two indexes made after the backup (the standby's own pool gets them from
# the WAL): "s" on PMEM, "m" on SSD (a budget below one leaf).  Each holds
# two clusters of 60 rows, near (0,0) and near (1000,1000): two leaves.
for my $t ([ 's', '' ], [ 'm', " WITH (pmem_budget = '1kB')" ])
{
	my ($tab, $options) = @$t;
	$primary->safe_psql('postgres', qq{
CREATE TABLE $tab (id int, b box);
CREATE INDEX ${tab}_b ON $tab USING amrtree (b)$options;
INSERT INTO $tab SELECT g, box(point(g * 0.5, g * 0.5), point(g * 0.5 + 0.25, g * 0.5 + 0.25))
  FROM generate_series(1, 60) g;
INSERT INTO $tab SELECT 1000 + g, box(point(1000 + g * 0.5, 1000 + g * 0.5),
  point(1000 + g * 0.5 + 0.25, 1000 + g * 0.5 + 0.25)) FROM generate_series(1, 60) g;});
}
$primary->safe_psql('postgres', q{
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
$primary->wait_for_catchup($standby);
$standby->stop('fast');

my $window = q{box '((-1,-1),(2000,2000))'};
my %leaves;
$leaves{$_} = $primary->safe_psql('postgres', "SELECT leaves FROM amrtree_index_stats('${_}_b')")
  for qw(s m);
# the crash may lose WAL before the transaction's too: recovery's records
# then go there
my $lsn0 = $primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');

# one transaction, left open, splits the leaf near (0,0) of both indexes;
# nothing of it is flushed
my ($in, $out) = ('', '');
my $open_tx = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $primary->connstr('postgres'), '-f', '-' ],
	'<', \$in, '>', \$out, '2>&1',
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
$in .= q{
BEGIN;
INSERT INTO s SELECT 5000 + g, box(point(g * 0.5 + 0.1, g * 0.5 + 0.1), point(g * 0.5 + 0.2, g * 0.5 + 0.2))
  FROM generate_series(1, 40) g;
INSERT INTO m SELECT 5000 + g, box(point(g * 0.5 + 0.1, g * 0.5 + 0.1), point(g * 0.5 + 0.2, g * 0.5 + 0.2))
  FROM generate_series(1, 40) g;
SELECT 'inserted';
};
$open_tx->pump until $out =~ /inserted/ || $out =~ /ERROR/;
is($out, "inserted\n", 'a transaction inserted 40 rows into each table and stays open');
for (qw(s m))
{
	cmp_ok($primary->safe_psql('postgres', "SELECT leaves FROM amrtree_index_stats('${_}_b')"),
		'>', $leaves{$_}, "the insert split a leaf of ${_}_b");
}

my $log_at = -s $primary->logfile;
$primary->stop('immediate');
$open_tx->kill_kill;
$primary->start;
for (qw(s m))
{
	is($primary->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM $_ WHERE b && $window"),
		120, "primary: ${_}_b finds the committed rows, not the lost ones");
}
ok($primary->wait_for_log(qr/were logged again, whole/, $log_at),
	'recovery logged the changed leaves again, whole');

# the resync records, in WAL order
my @resync = split /\n/, $primary->safe_psql('postgres', qq{
SELECT start_lsn || ' ' || description FROM pg_get_wal_records_info('$lsn0', pg_current_wal_flush_lsn())
WHERE resource_manager = 'amrtree' AND record_type = 'IMAGES' AND description LIKE '%resync%'
ORDER BY start_lsn});
cmp_ok(scalar(@resync), '>=', 1, 'recovery wrote resync records') or diag explain \@resync;
note "resync record: $_" for @resync;

# Stop after the first resync record of the tree with the most leaves
# logged again: its split's two halves.
my (%tree_leaves, %tree_first, @trees);
for (@resync)
{
	my ($lsn, $tree, $rest) = /^(\S+) rel (\S+) tree \S+; resync(?: part)?, \d+ images:(.*)$/ or next;
	push @trees, $tree unless exists $tree_first{$tree};
	$tree_first{$tree} //= $lsn;
	$tree_leaves{$tree} += () = $rest =~ / leaf /g;
}
my ($split_tree) = sort { $tree_leaves{$b} <=> $tree_leaves{$a} } @trees;
cmp_ok($tree_leaves{$split_tree}, '>=', 2, 'a lost split left two leaves of one index to log again');
my $stop_at = $tree_first{$split_tree};

# The standby replays up to and including the first resync record, then
# pauses.
$standby->append_conf('postgresql.conf', qq{
recovery_target_lsn = '$stop_at'
recovery_target_inclusive = on
recovery_target_action = 'pause'
});

sub start_paused
{
	$standby->start;
	$standby->poll_query_until('postgres', q{SELECT pg_get_wal_replay_pause_state() = 'paused'})
	  or die 'the standby did not pause at its recovery target';
	return;
}

# On $node, every way of scanning $tab returns what a sequential scan does.
sub scans_agree
{
	my ($node, $what) = @_;
	for my $tab (qw(s m))
	{
		my $q = "SELECT count(*), count(DISTINCT id) FROM $tab WHERE b && $window";
		my $seq = $node->safe_psql('postgres',
			"SET enable_indexscan = off; SET enable_bitmapscan = off; $q");
		is($seq, '120|120', "$what: a sequential scan of $tab returns the 120 committed rows");
		my $plain = $node->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; $q");
		is($plain, $seq, "$what: an index scan of ${tab}_b returns what a sequential scan returns");
		my $bitmap = $node->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_indexscan = off; $q");
		is($bitmap, $seq, "$what: a bitmap scan of ${tab}_b returns what a sequential scan returns");
		my $knn = $node->safe_psql('postgres', qq{SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*), count(DISTINCT id) FROM (SELECT id FROM $tab ORDER BY b <-> point(0, 0) LIMIT 1000) x});
		is($knn, $seq, "$what: an ordered scan of ${tab}_b returns every row once");
	}
	return;
}

start_paused();
is($standby->safe_psql('postgres', 'SELECT pg_last_wal_replay_lsn() >= ' . "'$stop_at'"),
	't', 'the standby replayed the first resync record');
scans_agree($standby, 'standby paused after the first resync record');

# its own crash recovery, from its last restartpoint, gets there again
$standby->stop('immediate');
start_paused();
scans_agree($standby, 'standby restarted and paused there again');

# promoted there, it keeps the index as that point left it
$standby->promote;
scans_agree($standby, 'standby promoted after the first resync record');

$standby->stop('immediate');

# Past AMR_WAL_MAX_RESYNC_IMAGES a tree's resync goes in parts
# (reconcile:resync_in_parts makes that one image per record).  A standby
# that has replayed some parts and not the last refuses the index with an
# error, across its own restart too, and once promoted there it rebuilds the
# index rather than use it.
$standby2->start;
$primary->safe_psql('postgres', q{
CREATE TABLE q (id int, b box);
CREATE INDEX q_b ON q USING amrtree (b) WITH (pmem_budget = '1kB');
INSERT INTO q SELECT id, b FROM m WHERE id <= 1060;
CHECKPOINT;});
$primary->wait_for_catchup($standby2);
$standby2->stop('fast');
$lsn0 = $primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');
($in, $out) = ('', '');
$open_tx = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $primary->connstr('postgres'), '-f', '-' ],
	'<', \$in, '>', \$out, '2>&1',
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
$in .= q{
BEGIN;
INSERT INTO q SELECT 5000 + g, box(point(g * 0.5 + 0.1, g * 0.5 + 0.1), point(g * 0.5 + 0.2, g * 0.5 + 0.2))
  FROM generate_series(1, 40) g;
SELECT 'inserted';
};
$open_tx->pump until $out =~ /inserted/ || $out =~ /ERROR/;
is($out, "inserted\n", 'parts: a transaction inserted 40 rows and stays open');
$primary->append_conf('postgresql.conf', "amrtree.fault_injection = 'reconcile:resync_in_parts'\n");
$primary->stop('immediate');
$open_tx->kill_kill;
$primary->start;
is($primary->safe_psql('postgres', "SELECT count(*) FROM q WHERE b && $window"),
	120, 'parts: the primary recovered');
my @parts = split /\n/, $primary->safe_psql('postgres', qq{
SELECT start_lsn || ' ' || description FROM pg_get_wal_records_info('$lsn0', pg_current_wal_flush_lsn())
WHERE resource_manager = 'amrtree' AND record_type = 'IMAGES' AND description LIKE '%resync part%'
ORDER BY start_lsn});
note "resync part: $_" for @parts;
cmp_ok(scalar(@parts), '>=', 1, 'parts: recovery logged a tree in parts');
($stop_at) = $parts[0] =~ /^(\S+)/;
$standby2->append_conf('postgresql.conf', qq{
recovery_target_lsn = '$stop_at'
recovery_target_inclusive = on
recovery_target_action = 'pause'
});

sub parts_refused
{
	my ($what) = @_;
	$standby2->start;
	$standby2->poll_query_until('postgres', q{SELECT pg_get_wal_replay_pause_state() = 'paused'})
	  or die 'the standby did not pause at its recovery target';
	my ($ret, $stdout, $stderr) = $standby2->psql('postgres',
		"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM q WHERE b && $window");
	like($stderr, qr/cannot be used until WAL replay has all of a resynchronisation of it/,
		"parts: $what: an index scan of q_b raises an error")
	  or diag "returned: $stdout; " . $standby2->safe_psql('postgres',
		"SET enable_seqscan = off; SET enable_bitmapscan = off; EXPLAIN SELECT count(*) FROM q WHERE b && $window");
	is($standby2->safe_psql('postgres', "SELECT count(*) FROM q WHERE b && $window"),
		120, "parts: $what: a sequential scan returns the committed rows");
	return;
}
parts_refused('standby paused after the first part');
$standby2->stop('immediate');
parts_refused('standby restarted and paused there again');

$standby2->promote;
my ($ret, $stdout, $stderr) = $standby2->psql('postgres',
	"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM q WHERE b && $window");
ok($stdout eq '120' || $stderr =~ /cannot be used on this server/,
	'parts: promoted, the index returns the committed rows or an error, never others')
  or diag "returned: $stdout; $stderr";
ok(amr_wait_for_index_use($standby2, 'postgres', "SELECT count(*) FROM q WHERE b && $window", 'q_b', 60),
	'parts: promoted, the index is rebuilt');
is($standby2->safe_psql('postgres',
		"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM q WHERE b && $window"),
	120, 'parts: promoted, the rebuilt index returns the committed rows');

$standby2->stop('immediate');
$primary->stop('immediate');
done_testing();
