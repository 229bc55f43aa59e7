# The crash matrix: every fault injection point (amrtree.fault_injection),
# each hit while pgbench inserts and queries concurrently, crashes the
# process that reaches it -- including the points between a WAL record and
# its change ("...:after_logged"), after which crash recovery must replay
# the change or, if the record did not reach durable WAL, find it beyond
# the replayed WAL; the postmaster's crash-restart cycle brings the server
# back, and then
#
#  - amrtree_check holds for every amrtree index (it also checks that no
#    slot or leaf leaked and that no tree lost its index),
#  - every strategy returns the rows a sequential scan returns,
#  - after VACUUM an index-only scan counts exactly the heap's rows (no
#    phantom),
#  - the pool holds exactly the leaves of the existing indexes, and
#  - a streaming standby (its own pool, replaying since before the first
#    index existed), once caught up, passes amrtree_check, holds in every
#    leaf the live entries the primary's leaf holds, and its index scans
#    agree with its sequential scans: what a crash lost from the WAL, the
#    primary's recovery prunes and logs again (docs/design.md, "WAL").
#
# AMRTREE_CRASH_ROUNDS=N adds N rounds at randomly chosen points and hit
# counts, for soak runs; AMRTREE_CRASH_ONLY=regex keeps only the points
# (and kinds: "spec kind") it matches, to soak one path.
# AMRTREE_CRASH_POOL=disk puts the pool where amrtree's default puts it, a
# file in the data directory written back in the background
# (docs/design.md, "Write-back pools"), instead of /dev/shm.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $started = time;
my $on_disk = ($ENV{AMRTREE_CRASH_POOL} // '') eq 'disk';
# wal_level = replica, PostgreSQL's default (the TAP default is minimal),
# and WAL kept for the standby across the crashes' checkpoints
my $node = amr_node('matrix', ($on_disk ? (pool => undef) : ()), init => { allows_streaming => 1 }, conf => q{
restart_after_crash = on
autovacuum = off
amrtree.scan_interval = 100ms
amrtree.promote_threshold = 2
amrtree.demote_threshold = 1
amrtree.ssd_size = 128MB
log_min_messages = warning
log_statement = none
wal_keep_size = 512MB
});
$node->start;

# the standby: from a backup taken before any index, with a pool of its own
$node->backup('b');
my $standby;
if ($on_disk)
{
	# the backup's copies, written back as the primary's are
	$standby = PostgreSQL::Test::Cluster->new('matrix_standby');
	$standby->init_from_backup($node, 'b', has_streaming => 1);
}
else
{
	$standby = amr_standby_own_pool($node, 'b', 'matrix_standby');
}
$standby->start;

$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
amr_load_porto($node, 'trips', 30000, 11);
$node->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b) WITH (pmem_budget = '40%');
VACUUM ANALYZE trips;
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT g, box(point(-8.64 + (g % 3) * 0.02, 41.14 + (g / 3) * 0.012),
              point(-8.64 + (g % 3) * 0.02 + 0.006, 41.14 + (g / 3) * 0.012 + 0.004))
FROM generate_series(0, 3) g;
});
amr_setup_parity($node);
$node->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});

my $dir = PostgreSQL::Test::Utils::tempdir();
my %script = (
	ins => q{
\set id random(1000000, 2000000000)
\set x random(0, 200000)
\set y random(0, 150000)
INSERT INTO trips (id, b, t) VALUES (:id,
  box(point(-8.70 + :x * 0.000001, 41.10 + :y * 0.000001),
      point(-8.70 + :x * 0.000001 + 0.0004, 41.10 + :y * 0.000001 + 0.0003)), 0);
},
	qry => q{
\set x random(0, 200000)
\set y random(0, 150000)
SELECT count(*) FROM trips
WHERE b && box(point(-8.70 + :x * 0.000001, 41.10 + :y * 0.000001),
               point(-8.70 + :x * 0.000001 + 0.004, 41.10 + :y * 0.000001 + 0.003));
},
	vac => q{
\set x random(0, 200000)
\set y random(0, 150000)
DELETE FROM trips WHERE ctid IN (SELECT ctid FROM trips
  WHERE b && box(point(-8.70 + :x * 0.000001, 41.10 + :y * 0.000001),
                 point(-8.70 + :x * 0.000001 + 0.01, 41.10 + :y * 0.000001 + 0.01)) LIMIT 40);
-- TRUNCATE off: cutting the heap's empty tail needs an exclusive lock that
-- the other clients never leave free; VACUUM would wait 5 s for it each time
-- (PostgreSQL's VACUUM_TRUNCATE_LOCK_TIMEOUT), and points with a hit count
-- were then not reached within a round
VACUUM (TRUNCATE off) trips;
},
	tier => q{
ALTER INDEX trips_b SET (pmem_budget = '10%');
SELECT amrtree_settle('trips_b', 0);
ALTER INDEX trips_b SET (pmem_budget = '90%');
SELECT amrtree_settle('trips_b', 0);
},
);
for my $name (keys %script)
{
	open my $fh, '>', "$dir/$name.sql" or die;
	print $fh $script{$name};
	close $fh;
}

# which workload and which action reach each point
my %workload_of = (
	vacuum => [ 'ins@3', 'qry@2', 'vac@2' ],
	tier => [ 'ins@3', 'qry@4', 'tier@1' ],
);

my @matrix = (
	[ 'append:before_entry', 'work' ],
	[ 'append:before_entry:40', 'work' ],
	[ 'append:after_entry_persisted', 'work' ],
	[ 'append:after_entry_persisted:150', 'work' ],
	[ 'append:after_count_persisted', 'work' ],
	[ 'append:after_count_persisted:300', 'work' ],
	[ 'append:after_logged', 'work' ],
	[ 'append:after_logged:60', 'work' ],
	[ 'append:reuse_after_entry_persisted', 'reuse' ],
	[ 'append:reuse_after_flag_persisted', 'reuse' ],
	[ 'first_leaf:before_image', 'first_leaf' ],
	[ 'first_leaf:after_image_persisted', 'first_leaf' ],
	[ 'first_leaf:after_publish', 'first_leaf' ],
	[ 'rewrite:before_image', 'work' ],
	[ 'rewrite:before_image:3', 'work' ],
	[ 'rewrite:after_image_persisted', 'work' ],
	[ 'rewrite:after_switch', 'work' ],
	[ 'rewrite:after_switch:5', 'work' ],
	[ 'split:before_images', 'work' ],
	[ 'split:after_right_persisted', 'work' ],
	[ 'split:after_new_leaf_persisted', 'work' ],
	[ 'split:after_new_leaf_persisted:6', 'work' ],
	[ 'split:after_publish', 'work' ],
	[ 'split:after_publish:4', 'work' ],
	[ 'split:after_switch', 'work' ],
	[ 'split:after_switch:9', 'work' ],
	[ 'split:after_logged', 'work' ],
	[ 'split:after_logged:7', 'work' ],
	[ 'switch:after_logged', 'vacuum' ],
	[ 'switch:after_logged:4', 'tier' ],
	[ 'switch:count_written', 'vacuum' ],
	[ 'switch:count_written:3', 'work' ],
	[ 'switch:count_written:4', 'tier' ],
	[ 'vacuum:before_image', 'vacuum' ],
	[ 'vacuum:after_image_persisted', 'vacuum' ],
	[ 'vacuum:after_switch', 'vacuum' ],
	[ 'vacuum:after_switch:6', 'vacuum' ],
	[ 'vacuum:pmem_full,vacuum:before_mark_dead', 'vacuum' ],
	[ 'vacuum:pmem_full,vacuum:before_marks_stored', 'vacuum' ],
	[ 'vacuum:pmem_full,vacuum:after_mark_dead:5', 'vacuum' ],
	[ 'promote:before_copy', 'tier' ],
	[ 'promote:after_copy_persisted', 'tier' ],
	[ 'promote:after_switch', 'tier' ],
	[ 'promote:after_switch:3', 'tier' ],
	[ 'demote:before_copy', 'tier' ],
	[ 'demote:after_copy_persisted', 'tier' ],
	[ 'demote:after_copy_persisted:2', 'tier' ],
	[ 'demote:after_switch', 'tier' ],
	[ 'demote:after_switch:10', 'tier' ],
	[ 'build:after_tree_created', 'build' ],
	[ 'build:before_leaf', 'build' ],
	[ 'build:after_leaf_persisted', 'build' ],
	[ 'build:after_leaf_published:30', 'build' ],
	[ 'build:after_metapage', 'build' ],
	[ 'create:before_valid', 'create' ],
	[ 'commit:before_apply', 'drop' ],
	[ 'drop:after_dropped_state', 'drop' ],
	[ 'drop:after_leaf_released:7', 'drop' ],
	[ 'drop:before_free_state', 'drop' ],
	[ 'reconcile:after_prune_horizon', 'reconcile' ],
	[ 'reconcile:after_release', 'reconcile' ],
	[ 'reconcile:after_prune', 'reconcile' ],
);

my $soak = $ENV{AMRTREE_CRASH_ROUNDS} || 0;
my $only = $ENV{AMRTREE_CRASH_ONLY};
if (defined $only)
{
	@matrix = grep { "$_->[0] $_->[1]" =~ /$only/ } @matrix;
	die "AMRTREE_CRASH_ONLY=$only matches no point of the matrix" unless @matrix;
}
if ($soak)
{
	my @pool = @matrix;
	srand($ENV{AMRTREE_CRASH_SEED} || time);
	for (1 .. $soak)
	{
		my $pick = $pool[ int(rand(@pool)) ];
		my ($spec, $kind) = @$pick;
		$spec =~ s/:\d+$//;
		# a hit count only where a point is reached many times per round
		# (not the reuse points: their workload may reuse only a few
		# positions)
		$spec .= ':' . (1 + int(rand(20)))
		  if $kind =~ /^(work|vacuum|tier)$/
		  || $spec =~ /^(build:after_leaf_published|drop:after_leaf_released)$/;
		push @matrix, [ $spec, $kind ];
	}
}

my $crashes = 0;
my $marker = $node->data_dir . '/amrtree_fault_fired';

sub arm
{
	my ($spec) = @_;
	unlink $marker;
	# not safe_psql: the workload may reach the point, and the crash end
	# this very session, as soon as the reload has signalled the backends
	$node->psql('postgres',
		"ALTER SYSTEM SET amrtree.fault_injection = '$spec'; SELECT pg_reload_conf();");
}

# The marker stays until the next arm(): a process that has not yet read
# the reloaded setting (the tier manager in the middle of a pass, started
# by the crash-restart with the setting still on) must not fire again
# during the checks.
sub disarm
{
	$node->safe_psql('postgres',
		"ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf();");
}

sub start_workload
{
	my ($kind, $round) = @_;
	my @files = map { my ($f, $w) = split /@/; ('-f', "$dir/$f.sql\@$w") }
	  @{ $workload_of{$kind} || [ 'ins@3', 'qry@2' ] };
	my $out = "$dir/pgbench-$round.out";
	return IPC::Run::start(
		[ 'pgbench', '-n', '-c', '3', '-j', '3', '-T', '120', @files,
		  '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', $out, '2>&1');
}

sub wait_for_crash
{
	my ($point, $log_at, $timeout) = @_;
	my $deadline = time + $timeout;
	while (time < $deadline)
	{
		my $log = slurp_file($node->logfile, $log_at);
		return 1 if $log =~ /fault injection: aborting at "\Q$point\E"/;
		usleep(100_000);
	}
	return 0;
}

# Index vs sequential scan, per strategy and window.  Every round checks the
# selective strategies and one of the others in turn; every tenth round and
# the last check all twelve.
my @all_ops = ('<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@', '&<|', '<<|', '|>>', '|&>');
my @selective_ops = ('&&', '~=', '@>', '<@');

sub parity
{
	my ($ops, $on) = @_;
	my $list = join(', ', map { "('$_')" } @$ops);
	my $res = ($on || $node)->safe_psql('postgres', qq{
SELECT count(*) FILTER (WHERE amr_ids('trips', op, qb, true) <> amr_ids('trips', op, qb, false)),
       sum(cardinality(amr_ids('trips', op, qb, false)))
FROM (VALUES $list) o(op), amr_windows});
	return split /\|/, $res;
}

sub check_all
{
	my ($what, $round_no, $full) = @_;
	my $indexes = $node->safe_psql('postgres', q{
SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE a.amname = 'amrtree'});
	my $ok = 1;
	for my $i (split / /, $indexes)
	{
		my ($ret, $out, $err) = $node->psql('postgres', "SELECT amrtree_check('$i')");
		$ok &&= is($ret == 0 ? $out : $err, 't', "$what: amrtree_check('$i')");
	}
	my ($mismatch, $rows) = parity($full ? [@all_ops] : [ @selective_ops, $all_ops[ $round_no % @all_ops ] ]);
	$ok &&= is($mismatch, 0, "$what: " . ($full ? 'every strategy agrees' : 'the strategies checked agree')
		  . " with a sequential scan ($rows rows)");
	$ok &&= is(amr_knn_mismatches($node, 'trips', $full ? 8 : 2, 30), 0,
		"$what: KNN (ORDER BY b <-> point) agrees with a sequential scan and sort");
	$node->safe_psql('postgres', 'VACUUM trips');
	my $ios = $node->safe_psql('postgres', q{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM trips WHERE b && box '((-1e9,-1e9),(1e9,1e9))'});
	my $heap = $node->safe_psql('postgres', 'SELECT count(*) FROM trips WHERE b IS NOT NULL');
	$ok &&= is($ios, $heap, "$what: index-only scan after VACUUM counts the heap's rows");
	my $leak = $node->safe_psql('postgres', q{
WITH s AS (SELECT sum((amrtree_index_stats(c.oid)).leaves) AS leaves
           FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'amrtree')
SELECT p.leaf_ids_used - coalesce(s.leaves, 0) FROM amrtree_pool_stats() p, s});
	# (slots against leaves: amrtree_check, under the lock that keeps the
	# tier manager's in-flight copies out of the count)
	$ok &&= is($leak, '0', "$what: the pool holds exactly the indexes' leaves");

	# the standby, caught up: the same live entries in every leaf
	$node->wait_for_catchup($standby);
	my $logged = $node->safe_psql('postgres', q{
SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE a.amname = 'amrtree' AND c.relpersistence = 'p'});
	for my $i (split / /, $logged)
	{
		my ($cret, $cout, $cerr) = $standby->psql('postgres', "SELECT amrtree_check('$i')");
		$ok &&= is($cret == 0 ? $cout : $cerr, 't', "$what: standby: amrtree_check('$i')");
		my $leaves = qq{SELECT md5(coalesce(string_agg(leaf_id || ':' || tid, ' ' ORDER BY leaf_id, tid), ''))
FROM amrtree_leaf_entries('$i') WHERE NOT dead};
		my ($ret, $out, $err) = $standby->psql('postgres', $leaves);
		my $same = is($ret == 0 ? $out : $err, $node->safe_psql('postgres', $leaves),
			"$what: standby: every leaf of $i holds the live entries it holds on the primary");
		diag_leaf_differences($node, $i) unless $same;
		$ok &&= $same;
	}
	($mismatch, $rows) = parity([@selective_ops], $standby);
	$ok &&= is($mismatch, 0, "$what: standby: the selective strategies agree with a sequential scan ($rows rows)");
	return $ok;
}

# What differs between the primary's and the standby's live entries of an
# index, with the Leaf Table rows of the leaves involved on both sides.
sub diag_leaf_differences
{
	my ($node, $index) = @_;
	my $entries = qq{SELECT leaf_id, tid, key, insert_lsn FROM amrtree_leaf_entries('$index')
WHERE NOT dead ORDER BY leaf_id, tid};
	my %side;
	for my $n ([ 'primary', $node ], [ 'standby', $standby ])
	{
		my ($ret, $out) = $n->[1]->psql('postgres', $entries);
		$side{ $n->[0] } = { map { my @f = split /\|/; ("$f[0]:$f[1]" => $_) } split /\n/, $out // '' };
	}
	my %leaves;
	for my $pair ([ 'primary', 'standby' ], [ 'standby', 'primary' ])
	{
		my @only = sort grep { !exists $side{ $pair->[1] }{$_} } keys %{ $side{ $pair->[0] } };
		diag scalar(@only) . " live entries only on the $pair->[0]"
		  . join('', map { "\n  $side{ $pair->[0] }{$_}" } @only[ 0 .. ($#only < 19 ? $#only : 19) ]);
		$leaves{ (split /:/)[0] } = 1 for @only;
	}
	my $ids = join(',', sort { $a <=> $b } keys %leaves) || '-1';
	for my $n ([ 'primary', $node ], [ 'standby', $standby ])
	{
		my ($ret, $out, $err) = $n->[1]->psql('postgres',
			qq{SELECT * FROM amrtree_leaf_table('$index') WHERE leaf_id IN ($ids) ORDER BY leaf_id});
		diag "$n->[0]'s Leaf Table rows of those leaves:\n" . ($ret == 0 ? $out : $err);
	}
	return;
}

sub crash_round
{
	my ($spec, $kind, $round) = @_;
	my @items = split /,/, $spec;
	my ($point) = grep { $_ !~ /pmem_full/ } @items;
	$point =~ s/:\d+$//;
	my $what = "round $round ($spec)";

	# preparation that must not crash
	if ($kind eq 'first_leaf')
	{
		$node->safe_psql('postgres', q{
DROP TABLE IF EXISTS fl;
CREATE TABLE fl (id int, b box);
CREATE INDEX fl_b ON fl USING amrtree (b);});
	}
	elsif ($kind eq 'drop')
	{
		$node->safe_psql('postgres', q{
DROP INDEX IF EXISTS trips_b2;
CREATE INDEX trips_b2 ON trips USING amrtree (b) WITH (pmem_budget = '30%');});
	}
	elsif ($kind eq 'build' || $kind eq 'create')
	{
		$node->safe_psql('postgres', 'DROP INDEX IF EXISTS trips_b2');
	}
	elsif ($kind eq 'reuse')
	{
		# dead positions in full PMEM leaves: VACUUM marks entries dead in
		# place when it finds no free slot (simulated here), and inserts
		# into a full leaf then reuse them instead of splitting it.
		# INDEX_CLEANUP ON: a plain VACUUM skips the indexes when under 2 %
		# of the table's pages have dead rows, as these few thousand rows
		# do unless earlier rounds left more (a soak round missed the
		# point that way)
		$node->safe_psql('postgres', q{
DELETE FROM trips WHERE id >= 3000000 AND id < 4000000;
INSERT INTO trips SELECT 3000000 + g, box(point(-8.611 + (g % 40) * 0.0001, 41.151 + (g / 40) * 0.0001),
  point(-8.611 + (g % 40) * 0.0001 + 0.00005, 41.151 + (g / 40) * 0.0001 + 0.00005)), 0
FROM generate_series(1, 1500) g;
DELETE FROM trips WHERE id >= 3000000 AND id < 4000000 AND id % 3 = 0;
SET amrtree.fault_injection = 'vacuum:pmem_full';
VACUUM (INDEX_CLEANUP ON) trips;});
	}
	my $log_at = -s $node->logfile;
	my $bench = start_workload($kind, $round);
	usleep(300_000);
	arm($spec);

	my $ddl = {
		first_leaf => q{INSERT INTO fl VALUES (1, box '((1,1),(2,2))')},
		build => q{CREATE INDEX trips_b2 ON trips USING amrtree (b) WITH (pmem_budget = '30%')},
		create => q{CREATE INDEX trips_b2 ON trips USING amrtree (b) WITH (pmem_budget = '30%')},
		drop => q{DROP INDEX trips_b2},
		reuse => q{INSERT INTO trips SELECT 3100000 + g, box(point(-8.611 + (g % 40) * 0.0001, 41.151 + (g / 40) * 0.0001),
  point(-8.611 + (g % 40) * 0.0001 + 0.00004, 41.151 + (g / 40) * 0.0001 + 0.00004)), 0
FROM generate_series(1, 1500) g},
	}->{$kind};
	$node->psql('postgres', $ddl) if $ddl;
	if ($kind eq 'reconcile')
	{
		# the points before WAL replay are in the startup process, whose
		# crash stops the server: start it again (the point fires once)
		$node->stop('immediate');
		$node->start(fail_ok => 1);
	}

	my $hit = wait_for_crash($point, $log_at, 30);
	$crashes++ if $hit;
	ok($hit, "$what: the point was reached and the process crashed");
	my $back;
	if ($kind eq 'reconcile' &&
		system('pg_ctl', 'status', '-D', $node->data_dir) != 0)
	{
		# the startup process crashed, and the postmaster stopped with it
		$node->_update_pid(0);
		$node->start;
		$back = amr_wait_for_server($node);
	}
	elsif ($hit)
	{
		# the postmaster may not have begun its crash-restart cycle yet:
		# a query now could reach the old server and the next one fail
		$back = amr_wait_for_crash_restart($node, $log_at);
	}
	else
	{
		$back = amr_wait_for_server($node);
	}
	$back or die "$what: the server did not come back";
	$bench->kill_kill;
	$bench->finish;
	disarm();
	if ($kind eq 'tier')
	{
		$node->safe_psql('postgres', q{ALTER INDEX trips_b SET (pmem_budget = '40%')});
	}
	# a crash during DDL must leave the DDL's index intact or absent, never broken
	check_all($what, $round, $round % 10 == 0) or diag slurp_file($node->logfile, $log_at);
}

my $round = 0;
for my $m (@matrix)
{
	$round++;
	crash_round($m->[0], $m->[1], $round);
	# keep the table from growing without bound
	if ($round % 10 == 0)
	{
		$node->safe_psql('postgres', q{DELETE FROM trips WHERE id >= 1000000 AND random() < 0.5; VACUUM trips});
	}
}

check_all('after all rounds', 0, 1);
$standby->stop;
cmp_ok($crashes, '>=', 50, "$crashes crashes injected") unless $soak || defined $only;
note sprintf('%d crashes in %d rounds, %.0f s', $crashes, $round, time - $started);
$node->stop;
done_testing();
