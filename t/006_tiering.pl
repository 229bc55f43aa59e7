# Three-tier placement: the budget sweep of the AMR-Tree paper (section 4.2)
# on Porto-like boxes inserted one by one, promotion of a region that queries
# make hot, the tier manager at work, cold leaves that stay on PMEM while the
# pool has room, SSD corruption detected, and (on a second, small pool)
# rule R5 making room, coldest first, once the pool is above its high
# watermark.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $rows = $ENV{AMR_SWEEP_ROWS} || 60000;
# An SSD cache of 32 leaves, far smaller than the SSD tier: its copies are
# evicted and refilled all the time, so every parity check below also checks
# that a recycled copy is never taken for the leaf it no longer holds.
my $node = amr_node('tiering', pmem_size => '512MB',
	conf => "amrtree.ssd_size = 512MB\namrtree.ssd_cache_size = 128kB\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');

# the data, loaded into a staging table; the indexed tables get it row by row
my $csv = amr_load_porto($node, 'staging', $rows, 3);
amr_setup_parity($node);
$node->safe_psql('postgres', q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT g, box(point(-8.66 + (g % 6) * 0.015, 41.13 + (g / 6) * 0.008),
              point(-8.66 + (g % 6) * 0.015 + 0.003, 41.13 + (g / 6) * 0.008 + 0.002))
FROM generate_series(0, 29) g;
INSERT INTO amr_windows VALUES (100, '((-8.7,41.0),(-8.5,41.2))');
});

my %config = (
	b20 => "pmem_budget = '20%'",
	b50 => "pmem_budget = '50%'",
	b80 => "pmem_budget = '80%'",
	unlimited => "pmem_budget = 'unlimited'",
	off => 'tiering = off');
for my $name (sort keys %config)
{
	$node->safe_psql('postgres', qq{
CREATE TABLE t_$name (id int, b box, t float8);
CREATE INDEX t_${name}_b ON t_$name USING amrtree (b) WITH ($config{$name});});
}

# insert one by one (each row goes through aminsert), in statements of 5,000,
# checking parity now and then while the tier manager moves leaves
my $step = 5000;
my $mid_mismatch = 0;
for (my $from = 1; $from <= $rows; $from += $step)
{
	my $to = $from + $step - 1;
	for my $name (sort keys %config)
	{
		$node->safe_psql('postgres',
			"INSERT INTO t_$name SELECT * FROM staging WHERE id BETWEEN $from AND $to ORDER BY id");
	}
	if ((($from - 1) / $step) % 5 == 4)
	{
		my ($m) = amr_parity_mismatches($node, 't_b20');
		$mid_mismatch += $m;
	}
}
is($mid_mismatch, 0, 'index agrees with a sequential scan while rows arrive and leaves move');

# settle in the background while the foreground keeps comparing
my $bg = $node->background_psql('postgres');
$bg->query_until(qr/started/, "\\echo started\nSELECT amrtree_settle('t_b20_b', 3);\n");
my ($during) = amr_parity_mismatches($node, 't_b20');
is($during, 0, 'index agrees with a sequential scan during amrtree_settle');
$bg->query_safe('SELECT 1');
$bg->quit;

for my $name (sort keys %config)
{
	$node->safe_psql('postgres', "SELECT amrtree_settle('t_${name}_b', 2)");
	my ($pmem, $ssd, $budget) = split /\|/, $node->safe_psql('postgres', qq{
SELECT (SELECT bytes FROM amrtree_tier_stats('t_${name}_b') WHERE tier = 'pmem'),
       (SELECT bytes FROM amrtree_tier_stats('t_${name}_b') WHERE tier = 'ssd'),
       (SELECT budget_bytes FROM amrtree_tier_stats('t_${name}_b') WHERE tier = 'pmem')});
	my ($budget_dem, $rule_dem, $promo) = split /\|/, $node->safe_psql('postgres',
		"SELECT budget_demotions, rule_demotions, promotions FROM amrtree_migration_stats('t_${name}_b')");
	my $leaf_bytes = $pmem + $ssd;
	note sprintf("%-9s PMEM %9d  SSD %9d  budget %s  promotions %d  budget demotions %d  rule demotions %d",
		$name, $pmem, $ssd, $budget eq '' ? 'none' : $budget, $promo, $budget_dem, $rule_dem);

	if ($name =~ /^b(\d+)$/)
	{
		# the budget as the paper states it: a share of the index's leaf bytes
		my $target = $1 / 100 * $leaf_bytes;
		my $ratio = $pmem / $target;
		ok($ratio >= 0.90 && $ratio <= 1.02,
			sprintf('%s%%: PMEM holds %.1f%% of its budget', $1, 100 * $ratio));
		cmp_ok($ssd, '>', 0, "$1%: the rest is on SSD");
		is($rule_dem, 0, "$1%: the pool is below its high watermark: only the budget demotes");
	}
	elsif ($name eq 'unlimited')
	{
		is($budget, '', 'unlimited: no PMEM budget');
		is($budget_dem, 0, 'unlimited: no budget demotions');
		is($rule_dem, 0, 'unlimited: the pool is below its high watermark: rule R5 demotes nothing');
		is($ssd, 0, 'unlimited: every leaf is on PMEM');
	}
	else
	{
		is($ssd, 0, 'tiering = off: every leaf stays on PMEM');
		is($promo + $budget_dem + $rule_dem, 0, 'tiering = off: the tier manager never moved a leaf');
	}
	my ($m, $r) = amr_parity_mismatches($node, "t_$name");
	is($m, 0, "$name: index agrees with a sequential scan after settling ($r rows)");
	is($node->safe_psql('postgres', "SELECT amrtree_check('t_${name}_b')"), 't', "$name: amrtree_check");
}

# the small SSD cache was busy: many more copies went in than it holds
my ($cache_slots, $hits, $fills) = split /\|/, $node->safe_psql('postgres',
	'SELECT size_bytes / 4096, hits, fills FROM amrtree_ssd_cache_stats()');
is($cache_slots, 32, 'amrtree.ssd_cache_size = 128kB gives 32 cached leaves');
cmp_ok($fills, '>', 10 * $cache_slots, "the SSD cache recycled its slots ($fills fills)");
cmp_ok($hits, '>', 0, "and answered lookups ($hits hits)");

# the tier manager is a visible background worker
like($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'"),
	qr/^1$/, 'the tier manager shows in pg_stat_activity');
cmp_ok($node->safe_psql('postgres', "SELECT scans FROM amrtree_migration_stats('t_b50_b')"),
	'>', 3, 'it scans on its own');

# --- promotion: queries make a cold region hot, it moves to PMEM
$node->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.decay_lambda = 2;
SELECT pg_reload_conf();});
sleep 3;    # the inserts' hotness decays away
$node->safe_psql('postgres', "SELECT amrtree_settle('t_b50_b', 0)");
my $region = $node->safe_psql('postgres', q{
SELECT mbr FROM amrtree_leaf_table('t_b50_b') WHERE tier = 'ssd' AND entries > 20
ORDER BY leaf_id LIMIT 1});
ok($region ne '', "a cold region on SSD: $region");
my $before = $node->safe_psql('postgres',
	"SELECT count(*) FROM amrtree_leaf_table('t_b50_b') WHERE tier = 'ssd' AND mbr && '$region'::box");
my $promotions_before = $node->safe_psql('postgres', "SELECT promotions FROM amrtree_migration_stats('t_b50_b')");
$node->safe_psql('postgres', join('', map {
	"SELECT count(*) FROM t_b50 WHERE b && '$region'::box;\n" } 1 .. 60));
$node->safe_psql('postgres', "SELECT amrtree_settle('t_b50_b', 0)");
my $after = $node->safe_psql('postgres',
	"SELECT count(*) FROM amrtree_leaf_table('t_b50_b') WHERE tier = 'ssd' AND mbr && '$region'::box");
cmp_ok($after, '<', $before, "queried SSD leaves were promoted ($before on SSD before, $after after)");
cmp_ok($node->safe_psql('postgres', "SELECT promotions FROM amrtree_migration_stats('t_b50_b')"),
	'>', $promotions_before, 'promotions were counted');
my ($pmem50, $ssd50) = split /\|/, $node->safe_psql('postgres', q{
SELECT sum(bytes) FILTER (WHERE tier = 'pmem'), sum(bytes) FILTER (WHERE tier = 'ssd')
FROM amrtree_tier_stats('t_b50_b')});
my $ratio50 = $pmem50 / (0.5 * ($pmem50 + $ssd50));
ok($ratio50 >= 0.90 && $ratio50 <= 1.02,
	sprintf('colder leaves made room: PMEM still at %.1f%% of the 50%% budget', 100 * $ratio50));
my ($m50) = amr_parity_mismatches($node, 't_b50');
is($m50, 0, 'index agrees with a sequential scan after the promotions');

# --- unlimited budget: its leaves have gone cold (decay_lambda = 2 since
# seconds ago, nobody queried them), but the pool has room, so rule R5
# leaves them on PMEM: it demotes only to make room (see the small pool below)
ok($node->safe_psql('postgres', 'SELECT pmem_slots_used * 100 <= pmem_slots * 90 FROM amrtree_pool_stats()') eq 't',
	'the pool is below its high watermark (90%)');
$node->safe_psql('postgres', "SELECT amrtree_settle('t_unlimited_b', 1)");
my ($cold, $all) = split /\|/, $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE hotness <= 0.5), count(*) FROM amrtree_leaf_table('t_unlimited_b')");
cmp_ok($cold, '>', 0, "unlimited: $cold of $all leaves are cold (hotness <= amrtree.demote_threshold)");
is($node->safe_psql('postgres', "SELECT rule_demotions FROM amrtree_migration_stats('t_unlimited_b')"),
	'0', 'unlimited: rule R5 demoted none of them');
is($node->safe_psql('postgres', "SELECT leaves FROM amrtree_tier_stats('t_unlimited_b') WHERE tier = 'ssd'"),
	'0', 'unlimited: every leaf is still on PMEM');
is($node->safe_psql('postgres', "SELECT budget_demotions FROM amrtree_migration_stats('t_unlimited_b')"),
	'0', 'unlimited: still no budget demotions');

# --- ALTER INDEX changes the budget at the next use
$node->safe_psql('postgres', q{ALTER INDEX t_b80_b SET (pmem_budget = '30%')});
$node->safe_psql('postgres', "SELECT amrtree_settle('t_b80_b', 0)");
my ($p30, $s30) = split /\|/, $node->safe_psql('postgres', q{
SELECT sum(bytes) FILTER (WHERE tier = 'pmem'), sum(bytes) FILTER (WHERE tier = 'ssd')
FROM amrtree_tier_stats('t_b80_b')});
my $r30 = $p30 / (0.3 * ($p30 + $s30));
ok($r30 >= 0.90 && $r30 <= 1.02, sprintf('ALTER INDEX ... SET (pmem_budget = 30%%): PMEM at %.1f%%', 100 * $r30));

# --- a damaged SSD slot raises a data-corruption error, never garbage
$node->stop;
my $ssd = $node->data_dir . '/pg_amrtree/ssd.slots';
{
	open my $fh, '+<:raw', $ssd or die "open $ssd: $!";
	my $size = -s $ssd;
	# flip one byte inside the entries of every slot in use
	for (my $off = 4096; $off + 4096 <= $size; $off += 4096)
	{
		seek $fh, $off + 100, 0;
		my $c;
		read $fh, $c, 1;
		seek $fh, $off + 100, 0;
		print $fh chr(ord($c) ^ 0x5a);
	}
	close $fh;
}
$node->start;
my ($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSET enable_seqscan = off; SELECT count(*) FROM t_b20 WHERE b && '((-8.7,41.0),(-8.5,41.2))'");
like($err, qr/ERROR:  XX001: checksum mismatch in leaf \d+ of amrtree index "t_b20_b"/,
	'a damaged SSD leaf raises data_corrupted naming the index and the leaf');
is($out, '', 'and returns no rows');
$node->safe_psql('postgres', 'REINDEX INDEX t_b20_b');
my ($mr) = amr_parity_mismatches($node, 't_b20');
is($mr, 0, 'REINDEX repairs it');

# --- the tier manager meets a damaged leaf: it reports it with the index's
# OID, puts that index off, and goes on with the others.  tiering = off
# promotes every SSD leaf, so t_b50_b's passes read its damaged ones; the
# rebuilt t_b80_b must still be promoted.  The worker visits the trees in
# record order, and a build takes the lowest free record: t_b50_b has the
# second, the first is free since t_b20_b's rebuild, so the first REINDEX
# puts t_b80_b there and frees the third, which the second REINDEX takes.
$node->safe_psql('postgres', 'REINDEX INDEX t_b80_b');
$node->safe_psql('postgres', 'REINDEX INDEX t_b80_b');
my $b50_oid = $node->safe_psql('postgres', "SELECT 't_b50_b'::regclass::oid");
my $log_from = -s $node->logfile;
$node->safe_psql('postgres', 'ALTER INDEX t_b50_b SET (tiering = off); ALTER INDEX t_b80_b SET (tiering = off)');
# the tree records take the option at the indexes' next use
$node->safe_psql('postgres',
	"SELECT count(*) FROM amrtree_tier_stats('t_b50_b') a, amrtree_tier_stats('t_b80_b') b");
ok($node->poll_query_until('postgres',
		"SELECT leaves = 0 FROM amrtree_tier_stats('t_b80_b') WHERE tier = 'ssd'"),
	'a damaged index does not hold up the tier manager: the healthy one is promoted');
sleep 3;
my $log = slurp_file($node->logfile, $log_from);
my $reports = () = $log =~ /checksum mismatch in leaf \d+ of amrtree index "\(tree \d+\)"/g;
ok($reports >= 1 && $reports <= 2,
	"the tier manager reported the damaged leaf $reports times in a few seconds, not at every pass");
like($log, qr/CONTEXT:  placing the leaves of the amrtree index with OID $b50_oid /,
	'the report names the index');
like($log, qr/LOG:  amrtree tier manager retries the index with OID $b50_oid in the database with OID \d+ in 10 s/,
	'and says when it retries');
# the failed promotion batches gave back only the slots they had taken
# (amrtree_check run by a superuser also checks the pool-wide slot maps)
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b80_b')}), 't',
	'failed migrations left the slot maps agreeing with the Leaf Table');
$node->safe_psql('postgres', 'REINDEX INDEX t_b50_b');
($mr) = amr_parity_mismatches($node, 't_b50');
is($mr, 0, 'and answers as a sequential scan does');

$node->stop;

# --- a nearly full pool: rule R5 makes room, coldest first, down to the low
# watermark (amrtree.pmem_high_watermark = 90, pmem_low_watermark = 80, the
# defaults).  A 32MB pool has a few thousand slots, and fillfactor = 10
# packs 8 entries a leaf (84 fit), so some tens of thousands of rows fill
# it.  The tier manager sleeps (scan_interval = 1h) until it is woken
# below, so that first amrtree_settle alone moves leaves; decay_lambda =
# 0.01 keeps a queried region hot for minutes.
my $full = amr_node('tiering_full', pmem_size => '32MB',
	conf => "amrtree.ssd_size = 64MB\namrtree.scan_interval = '1h'\namrtree.decay_lambda = 0.01\n");
$full->start;
$full->safe_psql('postgres', 'CREATE EXTENSION amrtree');
my $slots = $full->safe_psql('postgres', 'SELECT pmem_slots FROM amrtree_pool_stats()');
my $high = int($slots * 90 / 100);    # more slots used than this: above the high watermark
my $low = int($slots * 80 / 100);     # what R5 brings the use down to

sub pool_used
{
	return $full->safe_psql('postgres', 'SELECT pmem_slots_used FROM amrtree_pool_stats()');
}

sub full_stat
{
	my ($sql) = @_;
	return $full->safe_psql('postgres', $sql);
}

# a table of 8 * $leaves boxes on a grid, and its index, built with leaves of 8
sub fill_pool
{
	my ($table, $leaves) = @_;
	my $rows = 8 * $leaves;
	$full->safe_psql('postgres', qq{
CREATE TABLE $table (id int, b box);
INSERT INTO $table SELECT i, box(point(i % 400, i / 400), point(i % 400 + 0.5, i / 400 + 0.5))
FROM generate_series(1, $rows) i;
CREATE INDEX ${table}_b ON $table USING amrtree (b) WITH (fillfactor = 10);});
}

# index fa takes 70% of the pool; 60 queries make one region of it hot
fill_pool('fa', int(0.70 * $slots));
my $hot_box = "'((0,0),(40,5))'::box";
$full->safe_psql('postgres', join('', map {
	"SET enable_seqscan = off; SELECT count(*) FROM fa WHERE b && $hot_box;\n" } 1 .. 60));
my $hot = full_stat("SELECT count(*) FROM amrtree_leaf_table('fa_b') WHERE mbr && $hot_box");
cmp_ok($hot, '>', 0, "a hot region of $hot leaves");
# index fb takes the pool to 95%
fill_pool('fb', int(0.95 * $slots) - pool_used());
my $used0 = pool_used();
cmp_ok($used0, '>', $high, "two builds took the pool above its high watermark ($used0 of $slots slots)");
is(full_stat("SELECT sum(leaves) FROM amrtree_tier_stats('fa_b') WHERE tier = 'ssd'")
	  + full_stat("SELECT sum(leaves) FROM amrtree_tier_stats('fb_b') WHERE tier = 'ssd'"),
	0, 'the builds put every leaf on PMEM');

# settle fa: R5 demotes its coldest leaves until the pool is at the low watermark
$full->safe_psql('postgres', "SELECT amrtree_settle('fa_b', 0)");
is(pool_used(), $low, "settle: the pool is down to its low watermark ($low of $slots slots), no further");
is(full_stat("SELECT rule_demotions || '|' || budget_demotions FROM amrtree_migration_stats('fa_b')"),
	($used0 - $low) . '|0', 'settle: rule R5 made exactly that room (no budget demotions)');
is(full_stat("SELECT count(*) FROM amrtree_leaf_table('fa_b') WHERE mbr && $hot_box AND tier <> 'pmem'"),
	'0', 'settle: the hot region stayed on PMEM (coldest first)');
is(full_stat("SELECT leaves FROM amrtree_tier_stats('fb_b') WHERE tier = 'ssd'"), '0',
	'settle of fa left fb alone');
is(full_stat("SELECT amrtree_settle('fa_b', 0)"), '0',
	'between the watermarks, nothing more is demoted');

# index fc takes the pool above the high watermark again; the tier manager,
# woken, frees room across the indexes
fill_pool('fc', int(0.93 * $slots) - pool_used());
my $used1 = pool_used();
cmp_ok($used1, '>', $high, "a third build took the pool above its high watermark ($used1 of $slots slots)");
$full->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.scan_interval = '100ms';
SELECT pg_reload_conf();});
ok($full->poll_query_until('postgres', "SELECT pmem_slots_used <= $low FROM amrtree_pool_stats()"),
	'the tier manager brought the pool down to its low watermark');
sleep 1;    # ten more passes
is(pool_used(), $low, 'and left it there: R5 stops at the low watermark');
is(full_stat(q{SELECT sum(m.rule_demotions) || '|' || sum(m.budget_demotions)
FROM unnest(ARRAY['fa_b', 'fb_b', 'fc_b']::regclass[]) i, amrtree_migration_stats(i) m}),
	($used0 - $low + $used1 - $low) . '|0', 'all of it by rule R5');
is(full_stat("SELECT count(*) FROM amrtree_leaf_table('fa_b') WHERE mbr && $hot_box AND tier <> 'pmem'"),
	'0', 'the hot region is still on PMEM');
$full->safe_psql('postgres', q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows VALUES (1, '((0,0),(40,5))'), (2, '((100,10),(180,30))'), (3, '((-1,-1),(500,500))');});
amr_setup_parity($full);
for my $table ('fa', 'fb', 'fc')
{
	my ($m, $r) = amr_parity_mismatches($full, $table);
	is($m, 0, "$table: index agrees with a sequential scan across both tiers ($r rows)");
	is(full_stat("SELECT amrtree_check('${table}_b')"), 't', "$table: amrtree_check");
}
$full->stop;
done_testing();
