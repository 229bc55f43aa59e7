/*-------------------------------------------------------------------------
 *
 * amrtree.c
 *		Module entry point: GUCs, hooks, the access method handler, reloptions
 *		and key conversion.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

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

int			amr_dram_size_kb = 64 * 1024;
char	   *amr_pmem_path = NULL;
int			amr_pmem_size_mb = 256;
int			amr_persist_mode_setting = AMR_PERSIST_CLWB;
char	   *amr_ssd_path = NULL;
int			amr_ssd_size_mb = 1024;
int			amr_io_method_setting = AMR_IO_URING;
int			amr_ssd_sync_setting = AMR_SSD_SYNC_FDATASYNC;
int			amr_scan_interval_ms = 1000;
double		amr_decay_lambda = 0.1;
double		amr_promote_threshold = 4.0;
double		amr_demote_threshold = 0.5;
double		amr_update_ratio_threshold = 0.5;
double		amr_smo_threshold = 3.0;
int			amr_dram_leaf_cache_kb = 4096;
int			amr_ssd_cache_kb = 65536;
int			amr_budget_on_insert = AMR_BUDGET_INSERT_DEFER;
int			amr_wal_rmgr_id = RM_EXPERIMENTAL_ID;
bool		amr_preloaded = false;

static relopt_kind amr_relopt_kind;

static void validate_budget(const char *value);

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

static void
define_gucs(void)
{
	DefineCustomIntVariable("amrtree.dram_size",
							"Shared memory for amrtree inner nodes.",
							"Inner nodes of every amrtree index live here; they "
							"are rebuilt from the Leaf Table at startup.",
							&amr_dram_size_kb,
							64 * 1024, 256, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);
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
	DefineCustomIntVariable("amrtree.pmem_size",
							"Size of the persistent-memory pool.",
							"Used when the pool is created; a larger value "
							"enlarges an existing pool at the next start.",
							&amr_pmem_size_mb,
							256, 32, 16 * 1024,
							PGC_POSTMASTER,
							GUC_UNIT_MB,
							NULL, NULL, NULL);
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
	DefineCustomIntVariable("amrtree.ssd_size",
							"Size of the SSD slot file.",
							"A larger value enlarges the file at the next start; "
							"0 disables the SSD tier.",
							&amr_ssd_size_mb,
							1024, 0, 1024 * 1024,
							PGC_POSTMASTER,
							GUC_UNIT_MB,
							NULL, NULL, NULL);
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
	DefineCustomIntVariable("amrtree.scan_interval",
							"Time between two scans of the tier manager.",
							NULL,
							&amr_scan_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.decay_lambda",
							 "Decay rate of leaf hotness, per second.",
							 "h = h * exp(-lambda * dt) + 1 per access.",
							 &amr_decay_lambda,
							 0.1, 0.0, 100.0,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.promote_threshold",
							 "Hotness at which an SSD leaf is promoted to PMEM (theta up).",
							 NULL,
							 &amr_promote_threshold,
							 4.0, 0.0, 1e9,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.demote_threshold",
							 "Hotness at or below which a PMEM leaf is demoted to SSD (theta down).",
							 "Must be below amrtree.promote_threshold (hysteresis).",
							 &amr_demote_threshold,
							 0.5, 0.0, 1e9,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.update_ratio_threshold",
							 "Share of writes among a leaf's accesses that keeps it on PMEM (rule R3, phi).",
							 NULL,
							 &amr_update_ratio_threshold,
							 0.5, 0.0, 1.0,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("amrtree.smo_threshold",
							 "Split score at which a leaf is held in DRAM until it calms down (rule R6, psi).",
							 NULL,
							 &amr_smo_threshold,
							 3.0, 0.0, 1e9,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.dram_leaf_cache",
							"Shared memory for leaves held in DRAM by rule R6.",
							NULL,
							&amr_dram_leaf_cache_kb,
							4096, 0, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);
	DefineCustomIntVariable("amrtree.ssd_cache_size",
							"Shared memory for clean copies of leaves on the SSD tier.",
							"The SSD tier is read with O_DIRECT, bypassing the kernel's "
							"page cache; this cache keeps recently read and recently "
							"demoted SSD leaves so that they are not read back from "
							"the device.  0 disables it.",
							&amr_ssd_cache_kb,
							65536, 0, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);
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
	DefineCustomIntVariable("amrtree.wal_rmgr_id",
							"WAL resource manager id that amrtree registers.",
							"amrtree writes no WAL records; it registers a resource "
							"manager to learn where crash recovery ended.  Change it "
							"only if another extension uses the same id.",
							&amr_wal_rmgr_id,
							RM_EXPERIMENTAL_ID, RM_MIN_CUSTOM_ID, RM_MAX_CUSTOM_ID,
							PGC_POSTMASTER,
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
						 "unlimited", validate_budget, ShareUpdateExclusiveLock);
	add_bool_reloption(amr_relopt_kind, "tiering",
					   "Move leaves between PMEM and SSD by hotness and budget (off: everything stays on PMEM)",
					   true, ShareUpdateExclusiveLock);
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
	amr_register_worker();
}

/* ---- handler ---- */

PG_FUNCTION_INFO_V1(amrtree_handler);

Datum
amrtree_handler(PG_FUNCTION_ARGS)
{
	IndexAmRoutine *amroutine = makeNode(IndexAmRoutine);

	/* like GiST: strategies are not a fixed set, amvalidate checks them */
	amroutine->amstrategies = 0;
	amroutine->amsupport = 1;
	amroutine->amoptsprocnum = 0;
	amroutine->amcanorder = false;
	amroutine->amcanorderbyop = false;
	amroutine->amcanbackward = false;
	amroutine->amcanunique = false;
	amroutine->amcanmulticol = false;
	amroutine->amoptionalkey = true;
	amroutine->amsearcharray = false;
	amroutine->amsearchnulls = true;
	amroutine->amstorage = false;
	amroutine->amclusterable = true;
	amroutine->ampredlocks = false;
	amroutine->amcanparallel = false;
	amroutine->amcaninclude = false;
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
	amroutine->amproperty = NULL;
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

bool
amr_parse_budget(const char *s, AmrBudgetKind *kind, double *value)
{
	char	   *end;
	double		v;

	while (*s == ' ')
		s++;
	if (pg_strcasecmp(s, "unlimited") == 0)
	{
		*kind = AMR_BUDGET_UNLIMITED;
		*value = 0;
		return true;
	}
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0 || isnan(v) || isinf(v) || v <= 0)
		return false;
	while (*end == ' ')
		end++;
	if (*end == '%')
	{
		if (v > 100 || end[1] != '\0')
			return false;
		*kind = AMR_BUDGET_FRACTION;
		*value = v / 100.0;
		return true;
	}
	if (*end == '\0' || strcmp(end, "B") == 0)
		*value = v;
	else if (strcmp(end, "kB") == 0)
		*value = v * 1024.0;
	else if (strcmp(end, "MB") == 0)
		*value = v * 1024.0 * 1024.0;
	else if (strcmp(end, "GB") == 0)
		*value = v * 1024.0 * 1024.0 * 1024.0;
	else if (strcmp(end, "TB") == 0)
		*value = v * 1024.0 * 1024.0 * 1024.0 * 1024.0;
	else
		return false;
	*kind = AMR_BUDGET_BYTES;
	return true;
}

static void
validate_budget(const char *value)
{
	AmrBudgetKind kind;
	double		v;

	if (value != NULL && !amr_parse_budget(value, &kind, &v))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid value for amrtree option \"pmem_budget\": \"%s\"", value),
				 errdetail("Valid values are \"unlimited\", a percentage of the index's leaf bytes "
						   "such as \"20%%\", or a size such as \"64MB\" (units B, kB, MB, GB, TB).")));
}

bytea *
amroptions(Datum reloptions, bool validate)
{
	static const relopt_parse_elt tab[] = {
		{"pmem_budget", RELOPT_TYPE_STRING, offsetof(AmrOptions, pmem_budget_offset)},
		{"tiering", RELOPT_TYPE_BOOL, offsetof(AmrOptions, tiering)}
	};

	return (bytea *) build_reloptions(reloptions, validate,
									  amr_relopt_kind,
									  sizeof(AmrOptions), tab, lengthof(tab));
}

/* ---- keys ---- */

bool
amrcanreturn(Relation index, int attno)
{
	/* leaves store the exact box */
	return true;
}

void
amr_box_from_datum(Relation index, Datum d, AmrBox *out)
{
	BOX		   *b = DatumGetBoxP(d);

	out->xlo = b->low.x;
	out->ylo = b->low.y;
	out->xhi = b->high.x;
	out->yhi = b->high.y;
	if (amr_box_has_nan(out))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("amrtree index \"%s\" cannot store a box with NaN coordinates",
						RelationGetRelationName(index)),
				 errdetail("The box is %s.",
						   DatumGetCString(DirectFunctionCall1(box_out, d))),
				 errhint("Replace the NaN coordinates, or store NULL instead: "
						 "a NaN box has no position to index.")));
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
