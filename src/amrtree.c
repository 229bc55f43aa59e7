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
#include "access/xlog.h"
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
bool		amr_preloaded = false;

static relopt_kind amr_relopt_kind;

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
	MarkGUCPrefixReserved("amrtree");
}

void
_PG_init(void)
{
	amr_relopt_kind = add_reloption_kind();
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
	amr_shmem_init_hooks();
	amr_directory_register_hooks();
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

bytea *
amroptions(Datum reloptions, bool validate)
{
	/*
	 * No options yet; parsing through the standard machinery still rejects
	 * unknown names with the usual error.  pmem_budget and tiering join this
	 * table with the tiering issue.
	 */
	static const relopt_parse_elt tab[1];

	return (bytea *) build_reloptions(reloptions, validate,
									  amr_relopt_kind,
									  sizeof(AmrOptions), tab, 0);
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

XLogRecPtr
amr_insert_lsn(void)
{
	return GetXLogInsertRecPtr();
}
