/*-------------------------------------------------------------------------
 *
 * amrtree.c
 *		Module entry point: GUCs, hooks, the access method handler, reloptions
 *		and key conversion.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"
#include "amr_wal.h"

#include <math.h>

#include "access/reloptions.h"
#include "access/rmgr.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "commands/vacuum.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/geo_decls.h"
#include "utils/guc.h"
#include "utils/rel.h"

PG_MODULE_MAGIC;

int			amr_dram_size_kb = AMR_DRAM_SIZE_DEFAULT_KB;
char	   *amr_pmem_path = NULL;
int			amr_pmem_size_mb = AMR_PMEM_SIZE_DEFAULT_MB;
int			amr_persist_mode_setting = AMR_PERSIST_CLWB;
char	   *amr_ssd_path = NULL;
int			amr_ssd_size_mb = AMR_SSD_SIZE_DEFAULT_MB;
int			amr_io_method_setting = AMR_IO_URING;
int			amr_ssd_sync_setting = AMR_SSD_SYNC_FDATASYNC;
int			amr_tier_pass_interval_ms = AMR_TIER_PASS_INTERVAL_DEFAULT_MS;
double		amr_decay_lambda = AMR_DECAY_LAMBDA_DEFAULT;
double		amr_promote_threshold = AMR_PROMOTE_THRESHOLD_DEFAULT;
double		amr_demote_threshold = AMR_DEMOTE_THRESHOLD_DEFAULT;
double		amr_update_ratio_threshold = AMR_UPDATE_RATIO_DEFAULT;
double		amr_smo_threshold = AMR_SMO_THRESHOLD_DEFAULT;
int			amr_pmem_high_watermark = AMR_PMEM_HIGH_WATERMARK_DEFAULT;
int			amr_pmem_low_watermark = AMR_PMEM_LOW_WATERMARK_DEFAULT;
int			amr_dram_leaf_cache_kb = AMR_DRAM_LEAF_CACHE_DEFAULT_KB;
int			amr_ssd_cache_kb = AMR_SSD_CACHE_DEFAULT_KB;
int			amr_budget_on_insert = AMR_BUDGET_INSERT_DEFER;
int			amr_wal_rmgr_id = RM_EXPERIMENTAL_ID;
bool		amr_preloaded = false;

static relopt_kind amr_relopt_kind;

static void validate_budget(const char *value);

/* GiST's values for its "buffering" option */
static relopt_enum_elt_def buffering_options[] = {
	{"auto", 0},
	{"on", 1},
	{"off", 2},
	{(const char *) NULL}
};

static const struct config_enum_entry io_method_options[] = {
	{"io_uring", AMR_IO_URING, false},
	{"sync", AMR_IO_SYNC, false},
	{NULL, 0, false}
};

static const struct config_enum_entry ssd_sync_options[] = {
	{"fdatasync", AMR_SSD_SYNC_FDATASYNC, false},
	{"dsync", AMR_SSD_SYNC_DSYNC, false},
	{"none", AMR_SSD_SYNC_NONE, false},
	{NULL, 0, false}
};

static const struct config_enum_entry budget_on_insert_options[] = {
	{"defer", AMR_BUDGET_INSERT_DEFER, false},
	{"strict", AMR_BUDGET_INSERT_STRICT, false},
	{NULL, 0, false}
};

static const struct config_enum_entry persist_mode_options[] = {
	{"clwb", AMR_PERSIST_CLWB, false},
	{"clflush", AMR_PERSIST_CLFLUSH, false},
	{"nop", AMR_PERSIST_NOP, false},
	{NULL, 0, false}
};

void		_PG_init(void);

/*
 * The first server-start setting of amrtree that PostgreSQL rejected, if
 * any (see define_server_start_int).  Empty otherwise.
 */
static char rejected_setting[256];
static char rejected_detail[256];

/*
 * DefineCustomIntVariable for a PGC_POSTMASTER setting, remembering whether
 * PostgreSQL rejected the value given in the configuration.  It does so with
 * a WARNING and then uses the default, which for a setting that shapes
 * storage (a pool of 256 MB instead of the 1 MB asked for) is a silent
 * surprise; amrtree instead refuses to open its pool, naming the setting
 * (amr_rejected_setting).
 */
static void
define_server_start_int(const char *name, const char *short_desc, const char *long_desc,
						int *var, int boot, int min, int max, int flags)
{
	const char *raw = GetConfigOption(name, true, false);
	char	   *given = raw ? pstrdup(raw) : NULL;

	DefineCustomIntVariable(name, short_desc, long_desc, var, boot, min, max,
							PGC_POSTMASTER, flags, NULL, NULL, NULL);
	if (given != NULL && rejected_setting[0] == '\0')
	{
		int			value;
		const char *hint = NULL;
		const char *unit = (flags & GUC_UNIT_MB) ? " MB" : (flags & GUC_UNIT_KB) ? " kB" : "";

		if (!parse_int(given, &value, flags, &hint))
		{
			snprintf(rejected_setting, sizeof(rejected_setting), "%s = '%s'", name, given);
			snprintf(rejected_detail, sizeof(rejected_detail), "\"%s\" is not a valid value for %s.%s%s",
					 given, name, hint ? " " : "", hint ? hint : "");
		}
		else if (value < min || value > max)
		{
			snprintf(rejected_setting, sizeof(rejected_setting), "%s = '%s'", name, given);
			snprintf(rejected_detail, sizeof(rejected_detail),
					 "%d%s is outside the valid range for %s (%d%s .. %d%s).",
					 value, unit, name, min, unit, max, unit);
		}
	}
}

/*
 * The rejected server-start setting ("amrtree.pmem_size = '1MB'") and why,
 * or NULL when every one was accepted.
 */
const char *
amr_rejected_setting(const char **detail)
{
	if (rejected_setting[0] == '\0')
		return NULL;
	*detail = rejected_detail;
	return rejected_setting;
}

static void
define_gucs(void)
{
	define_server_start_int("amrtree.dram_size",
							"Shared memory for amrtree inner nodes.",
							"Inner nodes of every amrtree index live here; they "
							"are rebuilt from the Leaf Table at startup.",
							&amr_dram_size_kb, AMR_DRAM_SIZE_DEFAULT_KB,
							AMR_DRAM_SIZE_MIN_KB, AMR_DRAM_SIZE_MAX_KB, GUC_UNIT_KB);
	DefineCustomStringVariable("amrtree.pmem_path",
							   "Path of the persistent-memory pool holding the "
							   "Leaf Table and leaves.",
							   "Relative paths are relative to the data directory. "
							   "Put it on a DAX file system for real PMEM, or on "
							   "/dev/shm to emulate PMEM with DRAM.",
							   &amr_pmem_path,
							   "pg_amrtree/pmem.pool",
							   PGC_POSTMASTER,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);
	define_server_start_int("amrtree.pmem_size",
							"Size of the persistent-memory pool.",
							"Used when the pool is created; a larger value "
							"enlarges an existing pool at the next start.",
							&amr_pmem_size_mb, AMR_PMEM_SIZE_DEFAULT_MB,
							AMR_PMEM_SIZE_MIN_MB, AMR_PMEM_SIZE_MAX_MB, GUC_UNIT_MB);
	DefineCustomEnumVariable("amrtree.persist_mode",
							 "How stores to the PMEM pool are made durable.",
							 "clwb (default) writes cache lines back with clwb, "
							 "falling back to clflushopt or clflush; clflush "
							 "forces clflush; nop skips flushes and fences and "
							 "is NOT crash safe: it exists to measure the "
							 "cost of persistence, as the AMR-Tree paper does.",
							 &amr_persist_mode_setting,
							 AMR_PERSIST_CLWB,
							 persist_mode_options,
							 PGC_POSTMASTER,
							 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("amrtree.ssd_path",
							   "Path of the SSD slot file holding demoted leaves.",
							   "Relative paths are relative to the data directory.",
							   &amr_ssd_path,
							   "pg_amrtree/ssd.slots",
							   PGC_POSTMASTER,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);
	define_server_start_int("amrtree.ssd_size",
							"Size of the SSD slot file.",
							"A larger value enlarges the file at the next start; "
							"0 disables the SSD tier (once no leaf is on it).",
							&amr_ssd_size_mb, AMR_SSD_SIZE_DEFAULT_MB,
							AMR_SSD_SIZE_MIN_MB, AMR_SSD_SIZE_MAX_MB, GUC_UNIT_MB);
	DefineCustomEnumVariable("amrtree.io_method",
							 "How leaves are read from and written to the SSD tier.",
							 "io_uring submits the reads of a scan together; "
							 "sync uses pread/pwrite, for kernels without io_uring.",
							 &amr_io_method_setting,
							 AMR_IO_URING,
							 io_method_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
	DefineCustomEnumVariable("amrtree.ssd_sync",
							 "How writes to the SSD tier are made durable.",
							 "fdatasync after each write (default), dsync opens "
							 "the file with O_DSYNC, none skips it and is NOT "
							 "crash safe (measurement only).",
							 &amr_ssd_sync_setting,
							 AMR_SSD_SYNC_FDATASYNC,
							 ssd_sync_options,
							 PGC_POSTMASTER,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("amrtree.writeback",
							 "Write a pool on an ordinary disk file back in the background.",
							 "On, a pool that is neither persistent memory nor on tmpfs "
							 "is used through a copy in shared memory whose changes "
							 "reach the file in the background, commits being durable "
							 "through the WAL; off, every change is synced to the file "
							 "with msync (slow).",
							 &amr_writeback_enabled,
							 AMR_WRITEBACK_DEFAULT,
							 PGC_POSTMASTER,
							 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.writeback_delay",
							"Time between two background write-backs of a disk pool's dirty pages.",
							"Checkpoints write everything regardless; a longer delay "
							"only writes hot pages less often.",
							&amr_writeback_delay_ms,
							AMR_WRITEBACK_DELAY_DEFAULT_MS, AMR_WRITEBACK_DELAY_MIN_MS,
							AMR_WRITEBACK_DELAY_MAX_MS,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.scan_interval",
							"Time between two passes of the tier manager.",
							NULL,
							&amr_tier_pass_interval_ms,
							AMR_TIER_PASS_INTERVAL_DEFAULT_MS, AMR_TIER_PASS_INTERVAL_MIN_MS,
							AMR_TIER_PASS_INTERVAL_MAX_MS,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.decay_lambda",
							 "Decay rate of leaf hotness, per second.",
							 "h = h * exp(-lambda * dt) + 1 per access.",
							 &amr_decay_lambda,
							 AMR_DECAY_LAMBDA_DEFAULT, AMR_DECAY_LAMBDA_MIN, AMR_DECAY_LAMBDA_MAX,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.promote_threshold",
							 "Hotness at which an SSD leaf is promoted to PMEM (theta up).",
							 NULL,
							 &amr_promote_threshold,
							 AMR_PROMOTE_THRESHOLD_DEFAULT, AMR_THRESHOLD_MIN, AMR_THRESHOLD_MAX,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.demote_threshold",
							 "Hotness at or below which a PMEM leaf is demoted to SSD (theta down).",
							 "Must be below amrtree.promote_threshold (hysteresis).",
							 &amr_demote_threshold,
							 AMR_DEMOTE_THRESHOLD_DEFAULT, AMR_THRESHOLD_MIN, AMR_THRESHOLD_MAX,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.update_ratio_threshold",
							 "Share of writes among a leaf's accesses that keeps it on PMEM (rule R3, phi).",
							 NULL,
							 &amr_update_ratio_threshold,
							 AMR_UPDATE_RATIO_DEFAULT, AMR_UPDATE_RATIO_MIN, AMR_UPDATE_RATIO_MAX,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.smo_threshold",
							 "Split score at which a leaf is held in DRAM until it calms down (rule R6, psi).",
							 NULL,
							 &amr_smo_threshold,
							 AMR_SMO_THRESHOLD_DEFAULT, AMR_THRESHOLD_MIN, AMR_THRESHOLD_MAX,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.pmem_high_watermark",
							"Percent of the pool's PMEM slots in use above which cold leaves are demoted (rule R5).",
							"Below it a cold leaf stays on PMEM; 100 never demotes by R5.",
							&amr_pmem_high_watermark,
							AMR_PMEM_HIGH_WATERMARK_DEFAULT, AMR_WATERMARK_MIN, AMR_WATERMARK_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.pmem_low_watermark",
							"Percent of the pool's PMEM slots in use that rule R5 demotes down to.",
							"Taken as at most amrtree.pmem_high_watermark.",
							&amr_pmem_low_watermark,
							AMR_PMEM_LOW_WATERMARK_DEFAULT, AMR_WATERMARK_MIN, AMR_WATERMARK_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	define_server_start_int("amrtree.dram_leaf_cache",
							"Shared memory for leaves held in DRAM by rule R6.",
							NULL,
							&amr_dram_leaf_cache_kb, AMR_DRAM_LEAF_CACHE_DEFAULT_KB,
							AMR_CACHE_MIN_KB, AMR_CACHE_MAX_KB, GUC_UNIT_KB);
	define_server_start_int("amrtree.ssd_cache_size",
							"Shared memory for clean copies of leaves on the SSD tier.",
							"The SSD tier is read with O_DIRECT, bypassing the kernel's "
							"page cache; this cache keeps recently read and recently "
							"demoted SSD leaves so that they are not read back from "
							"the device.  0 disables it.",
							&amr_ssd_cache_kb, AMR_SSD_CACHE_DEFAULT_KB,
							AMR_CACHE_MIN_KB, AMR_CACHE_MAX_KB, GUC_UNIT_KB);
	DefineCustomEnumVariable("amrtree.budget_on_insert",
							 "How inserts respect an index's PMEM budget.",
							 "defer (default): new leaf images always go to PMEM and "
							 "the tier manager restores the budget at its next scan; "
							 "strict: while over budget, new leaves are written to "
							 "SSD synchronously (a hard cap, at the price of an SSD "
							 "write and sync inside the insert).",
							 &amr_budget_on_insert,
							 AMR_BUDGET_INSERT_DEFER,
							 budget_on_insert_options,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
	define_server_start_int("amrtree.wal_rmgr_id",
							"WAL resource manager id that amrtree registers.",
							"amrtree logs its changes with this resource manager "
							"id; a server replaying amrtree WAL must use the id the "
							"WAL was written with.  Change it only if another "
							"extension uses the same id.",
							&amr_wal_rmgr_id, RM_EXPERIMENTAL_ID,
							RM_MIN_CUSTOM_ID, RM_MAX_CUSTOM_ID, 0);
	DefineCustomBoolVariable("amrtree.auto_rebuild",
							 "Rebuild amrtree indexes that lost their tree, in the background.",
							 "When the pool an index was built in is gone (a reboot "
							 "cleared /dev/shm, the file was deleted), queries skip the "
							 "index and writes succeed meanwhile; on, a background "
							 "worker runs REINDEX INDEX CONCURRENTLY on it; off leaves "
							 "that to the administrator.",
							 &amr_auto_rebuild,
							 AMR_AUTO_REBUILD_DEFAULT,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
	amr_fault_define_guc();
	MarkGUCPrefixReserved("amrtree");
}

void
_PG_init(void)
{
	amr_relopt_kind = add_reloption_kind();
	add_string_reloption(amr_relopt_kind, "pmem_budget",
						 "PMEM budget of the index: unlimited, a percentage of its leaf bytes (20%), or a size (64MB)",
						 AMR_PMEM_BUDGET_DEFAULT, validate_budget, ShareUpdateExclusiveLock);
	add_bool_reloption(amr_relopt_kind, "tiering",
					   "Move leaves between PMEM and SSD by hotness and budget (off: everything stays on PMEM)",
					   AMR_TIERING_DEFAULT, ShareUpdateExclusiveLock);
	add_bool_reloption(amr_relopt_kind, "free_empty_leaves",
					   "VACUUM frees the leaves it empties when it can lock the index at once",
					   AMR_FREE_EMPTY_LEAVES_DEFAULT, ShareUpdateExclusiveLock);
	add_int_reloption(amr_relopt_kind, "fillfactor",
					  "Packs every index leaf of a build to this percentage",
					  AMR_FILLFACTOR_DEFAULT, AMR_FILLFACTOR_MIN, AMR_FILLFACTOR_MAX,
					  ShareUpdateExclusiveLock);
	add_enum_reloption(amr_relopt_kind, "buffering",
					   "Accepted for compatibility with GiST; amrtree always builds by sorting",
					   buffering_options, 0,
					   gettext_noop("Valid values are \"on\", \"off\", and \"auto\"."),
					   ShareUpdateExclusiveLock);
	if (!process_shared_preload_libraries_in_progress)
	{
		/*
		 * Loaded on demand (CREATE EXTENSION, a function call).  Nothing can
		 * work without the shared memory reserved at server start, and
		 * server-start settings cannot be defined now: every entry point
		 * reports the missing preload instead.
		 */
		return;
	}

	amr_preloaded = true;
	define_gucs();
	amr_register_wal_rmgr(amr_wal_rmgr_id);
	amr_shmem_init_hooks();
	amr_directory_register_hooks();
	amr_heal_register_hooks();
	amr_plan_register_hooks();
	amr_pins_register_callbacks();
	amr_tier_register_callbacks();
	amr_register_worker();
	amr_wb_register_worker();
}

/* ---- handler ---- */

PG_FUNCTION_INFO_V1(amrtree_handler);

Datum
amrtree_handler(PG_FUNCTION_ARGS)
{
	IndexAmRoutine *amroutine = makeNode(IndexAmRoutine);

	/* like GiST: strategies are not a fixed set, amvalidate checks them */
	amroutine->amstrategies = 0;
	amroutine->amsupport = 3;
	amroutine->amoptsprocnum = 0;
	amroutine->amcanorder = false;
	amroutine->amcanorderbyop = true;
	amroutine->amcanbackward = false;
	amroutine->amcanunique = false;
	amroutine->amcanmulticol = false;
	amroutine->amoptionalkey = true;
	amroutine->amsearcharray = false;
	amroutine->amsearchnulls = true;
	amroutine->amstorage = false;
	amroutine->amclusterable = true;
	amroutine->ampredlocks = true;	/* leaves and inner nodes, see
									 * amr_pred_*_block */
	amroutine->amcanparallel = false;
	amroutine->amcaninclude = true;
	amroutine->amusemaintenanceworkmem = false;
	amroutine->amparallelvacuumoptions = VACUUM_OPTION_NO_PARALLEL;
	amroutine->amkeytype = InvalidOid;

	amroutine->ambuild = amrbuild;
	amroutine->ambuildempty = amrbuildempty;
	amroutine->aminsert = amrinsert;
	amroutine->ambulkdelete = amrbulkdelete;
	amroutine->amvacuumcleanup = amrvacuumcleanup;
	amroutine->amcanreturn = amrcanreturn;
	amroutine->amcostestimate = amrcostestimate;
	amroutine->amoptions = amroptions;
	amroutine->amproperty = amrproperty;
	amroutine->ambuildphasename = amrbuildphasename;
	amroutine->amvalidate = amrvalidate;
	amroutine->amadjustmembers = NULL;
	amroutine->ambeginscan = amrbeginscan;
	amroutine->amrescan = amrrescan;
	amroutine->amgettuple = amrgettuple;
	amroutine->amgetbitmap = amrgetbitmap;
	amroutine->amendscan = amrendscan;
	amroutine->ammarkpos = NULL;
	amroutine->amrestrpos = NULL;
	amroutine->amestimateparallelscan = NULL;
	amroutine->aminitparallelscan = NULL;
	amroutine->amparallelrescan = NULL;

	PG_RETURN_POINTER(amroutine);
}

/* ---- reloptions ---- */

/*
 * Parse a pmem_budget value: "unlimited", a percentage of the index's leaf
 * bytes ("20%", more than 0 and at most 100), or a size with an optional
 * unit B, kB, MB, GB, TB ("64MB"), more than 0 and less than 2^63 bytes.
 */
AmrBudgetParse
amr_parse_budget(const char *s, AmrBudgetKind *kind, double *value)
{
	char	   *end;
	double		v;
	double		unit;

	while (*s == ' ')
		s++;
	if (pg_strcasecmp(s, "unlimited") == 0)
	{
		*kind = AMR_BUDGET_UNLIMITED;
		*value = 0;
		return AMR_BUDGET_PARSE_OK;
	}
	errno = 0;
	v = strtod(s, &end);
	if (end == s || isnan(v))
		return AMR_BUDGET_PARSE_SYNTAX;
	while (*end == ' ')
		end++;
	if (*end == '%')
	{
		if (end[1] != '\0')
			return AMR_BUDGET_PARSE_SYNTAX;
		if (errno != 0 || !(v > 0 && v <= 100))
			return AMR_BUDGET_PARSE_RANGE;
		*kind = AMR_BUDGET_FRACTION;
		*value = v / 100.0;
		return AMR_BUDGET_PARSE_OK;
	}
	if (*end == '\0' || strcmp(end, "B") == 0)
		unit = 1.0;
	else if (strcmp(end, "kB") == 0)
		unit = 1024.0;
	else if (strcmp(end, "MB") == 0)
		unit = 1024.0 * 1024.0;
	else if (strcmp(end, "GB") == 0)
		unit = 1024.0 * 1024.0 * 1024.0;
	else if (strcmp(end, "TB") == 0)
		unit = 1024.0 * 1024.0 * 1024.0 * 1024.0;
	else
		return AMR_BUDGET_PARSE_SYNTAX;

	/*
	 * an overflowing strtod sets errno; infinities and 2^63 and up do not
	 * fit; less than a byte would be a budget of none, which 0 is refused as
	 */
	if (errno != 0 || !(v * unit >= 1.0) || !(v * unit < 9223372036854775808.0))
		return AMR_BUDGET_PARSE_RANGE;
	*kind = AMR_BUDGET_BYTES;
	*value = v * unit;
	return AMR_BUDGET_PARSE_OK;
}

static void
validate_budget(const char *value)
{
	AmrBudgetKind kind;
	double		v;

	if (value == NULL)
		return;
	switch (amr_parse_budget(value, &kind, &v))
	{
		case AMR_BUDGET_PARSE_OK:
			break;
		case AMR_BUDGET_PARSE_SYNTAX:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid value for amrtree option \"pmem_budget\": \"%s\"", value),
					 errdetail("Valid values are \"unlimited\", a percentage of the index's leaf bytes "
							   "such as \"20%%\", or a size such as \"64MB\" (units B, kB, MB, GB, TB).")));
			break;
		case AMR_BUDGET_PARSE_RANGE:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("value for amrtree option \"pmem_budget\" is out of range: \"%s\"", value),
					 errdetail("A percentage must be more than 0%% and at most 100%%; a size must be at least 1 byte and less than 8 EB (2^63 bytes)."),
					 errhint("Use \"unlimited\" for no budget.")));
			break;
	}
}

bytea *
amroptions(Datum reloptions, bool validate)
{
	static const relopt_parse_elt tab[] = {
		{"pmem_budget", RELOPT_TYPE_STRING, offsetof(AmrOptions, pmem_budget_offset)},
		{"tiering", RELOPT_TYPE_BOOL, offsetof(AmrOptions, tiering)},
		{"fillfactor", RELOPT_TYPE_INT, offsetof(AmrOptions, fillfactor)},
		{"buffering", RELOPT_TYPE_ENUM, offsetof(AmrOptions, buffering)},
		{"free_empty_leaves", RELOPT_TYPE_BOOL, offsetof(AmrOptions, free_empty_leaves)}
	};

	return (bytea *) build_reloptions(reloptions, validate,
									  amr_relopt_kind,
									  sizeof(AmrOptions), tab, lengthof(tab));
}

int
amr_build_leaf_fill(Relation index)
{
	AmrOptions *o = (AmrOptions *) index->rd_options;
	int			fillfactor = o ? o->fillfactor : AMR_FILLFACTOR_DEFAULT;

	return Max(1, (int) (AMR_LEAF_CAPACITY * fillfactor / 100));
}

bool
amr_free_empty_leaves(Relation index)
{
	AmrOptions *o = (AmrOptions *) index->rd_options;

	return o ? o->free_empty_leaves : AMR_FREE_EMPTY_LEAVES_DEFAULT;
}

/* ---- keys ---- */

bool
amrcanreturn(Relation index, int attno)
{
	/*
	 * Leaves store the key's box: the value itself (box_ops), a box that
	 * determines it (support function 2), or only a bounding box.  INCLUDE
	 * columns are not stored (a leaf entry is a fixed 48 bytes), so they are
	 * fetched from the heap.
	 */
	return attno == 1 && amr_opclass_keys_exact(index);
}


/*
 * The end of the WAL inserted so far.  GetXLogInsertRecPtr() names where
 * the next record's data would go, which on a fresh page is past the page
 * header: a position no record has reached yet.  XLogFlush() of it fails
 * ("xlog flush request ... is not satisfied") when nothing follows, and as
 * an entry's insert_lsn it would lie beyond a recovery that ended exactly
 * at the page boundary, pruning an entry whose row survived.  So step back
 * over the header: every record inserted so far ends at or before that.
 */
XLogRecPtr
amr_insert_lsn(void)
{
	XLogRecPtr	pos = GetXLogInsertRecPtr();
	uint32		in_page = (uint32) (pos % XLOG_BLCKSZ);

	if (XLogSegmentOffset(pos, wal_segment_size) == SizeOfXLogLongPHD)
		return pos - SizeOfXLogLongPHD;
	if (in_page == SizeOfXLogShortPHD)
		return pos - SizeOfXLogShortPHD;
	return pos;
}
