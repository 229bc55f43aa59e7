# Three-tier placement: the budget sweep of the AMR-Tree paper (section 4.2)
# on Porto-like boxes inserted one by one, promotion of a region that queries
# make hot, the tier manager at work, and SSD corruption detected.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $rows = $ENV{AMR_SWEEP_ROWS} || 100000;
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
	}
	elsif ($name eq 'unlimited')
	{
		is($budget, '', 'unlimited: no PMEM budget');
		is($budget_dem, 0, 'unlimited: no budget demotions (only rule R5 demotes)');
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

# --- unlimited budget: cold leaves go to SSD by rule R5, hot ones come back
$node->safe_psql('postgres', "SELECT amrtree_settle('t_unlimited_b', 1)");
my ($rule_dem) = $node->safe_psql('postgres',
	"SELECT rule_demotions FROM amrtree_migration_stats('t_unlimited_b')");
cmp_ok($rule_dem, '>', 0, "unlimited: cold leaves were demoted by rule R5 ($rule_dem)");
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

$node->stop;
done_testing();
