/*-------------------------------------------------------------------------
 *
 * amrtree.h
 *		Declarations shared by the PostgreSQL side of amrtree (the index AM
 *		glue, shared memory, the pool, the tree directory).
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMRTREE_H
#define AMRTREE_H

#include "postgres.h"

#include "access/amapi.h"
#include "access/genam.h"
#include "access/xlogdefs.h"
#include "catalog/pg_control.h"
#include "nodes/pathnodes.h"
#include "port/atomics.h"
#include "common/relpath.h"
#include "lib/stringinfo.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "datatype/timestamp.h"
#include "utils/geo_decls.h"
#include "utils/relcache.h"

#include "core/amr_format.h"
#include "core/amr_persist.h"
#include "core/amr_policy.h"
#include "core/amr_ssd.h"
#include "core/amr_tree.h"

#define AMRTREE_EXTENSION_VERSION "0.3"

/*
 * ---- GUCs (amrtree.c) ----
 *
 * Every tunable's default and limits, used by its definition and by the
 * code that depends on them (as pgvector's hnsw.h does).  Sizes are in the
 * unit of the setting.
 */
#define AMR_AUTO_REBUILD_DEFAULT		true
#define AMR_DRAM_SIZE_DEFAULT_KB		(64 * 1024)
#define AMR_DRAM_SIZE_MIN_KB			256
#define AMR_DRAM_SIZE_MAX_KB			(INT_MAX / 2)
#define AMR_PMEM_SIZE_DEFAULT_MB		256
#define AMR_PMEM_SIZE_MIN_MB			32
/*
 * 4 TB: 2^30 slots of 4 KiB (AMR_MAX_SLOTS; slot numbers are 30 bits of the
 * Leaf Table word).  The real bound is shared memory: each leaf id costs
 * about 72 bytes of DRAM (AmrLeafVolatile) plus bitmap bits, about 1.8% of
 * the pool, so a 1 TB pool needs about 18 GB of shared memory, and the
 * server refuses to start (out of shared memory) where that is not there.
 */
#define AMR_PMEM_SIZE_MAX_MB			(4 * 1024 * 1024)
#define AMR_WRITEBACK_DEFAULT			true
#define AMR_WRITEBACK_DELAY_DEFAULT_MS	200
#define AMR_WRITEBACK_DELAY_MIN_MS		10
#define AMR_WRITEBACK_DELAY_MAX_MS		(3600 * 1000)
#define AMR_SSD_SIZE_DEFAULT_MB			1024
#define AMR_SSD_SIZE_MIN_MB				0	/* no SSD tier */
#define AMR_SSD_SIZE_MAX_MB				(1024 * 1024)
#define AMR_TIER_PASS_INTERVAL_DEFAULT_MS	1000
#define AMR_TIER_PASS_INTERVAL_MIN_MS		10
#define AMR_TIER_PASS_INTERVAL_MAX_MS		(3600 * 1000)
#define AMR_DECAY_LAMBDA_DEFAULT		0.1
#define AMR_DECAY_LAMBDA_MIN			0.0
#define AMR_DECAY_LAMBDA_MAX			100.0
#define AMR_PROMOTE_THRESHOLD_DEFAULT	4.0
#define AMR_DEMOTE_THRESHOLD_DEFAULT	0.5
#define AMR_THRESHOLD_MIN				0.0
#define AMR_THRESHOLD_MAX				1e9
#define AMR_UPDATE_RATIO_DEFAULT		0.5
#define AMR_UPDATE_RATIO_MIN			0.0
#define AMR_UPDATE_RATIO_MAX			1.0
#define AMR_SMO_THRESHOLD_DEFAULT		3.0

/*
 * Rule R5 demotes cold leaves only while more than the high watermark of
 * the pool's PMEM slots are in use, and then down to the low watermark
 * (percent).  90: the last tenth stays free for what must land on PMEM
 * between two passes -- inserts and splits under budget_on_insert = defer,
 * a CREATE INDEX, which spills to SSD only at the reserve, and promotions
 * -- so that they rarely find PMEM full and write to SSD inside the
 * statement.  80: a gap of a tenth of the pool makes each demotion wave a
 * large batch (one io_uring submission and one sync per 256 leaves) that
 * lasts many intervals of inserts, instead of a few leaves at every pass
 * once inserts cross one line (hysteresis, as theta_up/theta_down).  A high
 * watermark of 100 turns R5 off; 0 and 0 demote every cold leaf, as the
 * paper does.
 */
#define AMR_PMEM_HIGH_WATERMARK_DEFAULT	90
#define AMR_PMEM_LOW_WATERMARK_DEFAULT	80
#define AMR_WATERMARK_MIN				0
#define AMR_WATERMARK_MAX				100
#define AMR_DRAM_LEAF_CACHE_DEFAULT_KB	4096
#define AMR_SSD_CACHE_DEFAULT_KB		65536
#define AMR_CACHE_MIN_KB				0	/* disabled */
#define AMR_CACHE_MAX_KB				(INT_MAX / 2)

/*
 * Reloptions: pmem_budget (a string, see amr_parse_budget), tiering and
 * free_empty_leaves; and GiST's fillfactor (the same range and default) and
 * buffering (accepted so that GiST's DDL runs unchanged; amrtree always
 * builds by sorting).
 */
#define AMR_PMEM_BUDGET_DEFAULT			"unlimited"
#define AMR_TIERING_DEFAULT				true
#define AMR_FREE_EMPTY_LEAVES_DEFAULT	true
#define AMR_FILLFACTOR_DEFAULT			90
#define AMR_FILLFACTOR_MIN				10
#define AMR_FILLFACTOR_MAX				100

/* How full a build packs leaves, in entries, from the index's fillfactor. */
extern int	amr_build_leaf_fill(Relation index);

/* The index's free_empty_leaves option (see amr_vacuum.c). */
extern bool amr_free_empty_leaves(Relation index);

extern int	amr_dram_size_kb;
extern char *amr_pmem_path;
extern int	amr_pmem_size_mb;
extern int	amr_persist_mode_setting;
extern char *amr_ssd_path;
extern int	amr_ssd_size_mb;
extern int	amr_io_method_setting;
extern int	amr_ssd_sync_setting;
extern int	amr_tier_pass_interval_ms;
extern double amr_decay_lambda;
extern double amr_promote_threshold;
extern double amr_demote_threshold;
extern double amr_update_ratio_threshold;
extern double amr_smo_threshold;
extern int	amr_pmem_high_watermark;
extern int	amr_pmem_low_watermark;
extern int	amr_dram_leaf_cache_kb;
extern int	amr_ssd_cache_kb;
extern int	amr_budget_on_insert;
extern int	amr_wal_rmgr_id;

/* a server-start setting PostgreSQL rejected ("name = 'value'"), or NULL */
extern const char *amr_rejected_setting(const char **detail);

#define AMR_BUDGET_INSERT_DEFER		0
#define AMR_BUDGET_INSERT_STRICT	1

/* True once _PG_init ran inside shared_preload_libraries. */
extern bool amr_preloaded;

/* ---- reloptions ---- */
typedef struct AmrOptions
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int			pmem_budget_offset; /* string: "unlimited", "20%", "64MB" */
	bool		tiering;
	int			fillfactor;		/* how full a build packs leaves, percent */
	int			buffering;		/* GiST's option, accepted, no effect */
	bool		free_empty_leaves;	/* VACUUM frees the leaves it empties */
} AmrOptions;

/* pmem_budget parsed: kind and value (fraction or bytes) */
typedef enum AmrBudgetParse
{
	AMR_BUDGET_PARSE_OK,
	AMR_BUDGET_PARSE_SYNTAX,
	AMR_BUDGET_PARSE_RANGE
} AmrBudgetParse;

/* Parse a pmem_budget value into its kind and value (fraction or bytes). */
extern AmrBudgetParse amr_parse_budget(const char *s, AmrBudgetKind *kind, double *value);

/* ---- shared state (amr_shmem.c) ---- */

typedef enum AmrPoolStatus
{
	AMR_POOL_NOT_CONFIGURED = 0,	/* not preloaded: no shared memory */
	AMR_POOL_READY,
	AMR_POOL_FAILED				/* opening or creating the pool failed */
} AmrPoolStatus;

/* rebuild requests for indexes that lost their tree (amr_heal.c) */
#define AMR_HEAL_MAX_DBS 64

typedef struct AmrHealQueue
{
	slock_t		mutex;
	bool		all_databases;	/* visit every database */
	int			ndbs;
	Oid			dbs[AMR_HEAL_MAX_DBS];	/* databases to visit, oldest first */
	Latch	   *tier_manager_latch; /* wakes the launcher, once it runs */
	int			failures;		/* rebuild runs in a row that failed */
	TimestampTz retry_after;	/* no launch before, after a failure */
} AmrHealQueue;

typedef struct AmrSharedState
{
	LWLock		directory_lock; /* tree directory: create, drop, lookup */
	LWLock		attach_lock;	/* serialises the startup reconciliation */
	LWLock		publish_lock;	/* shared by slot reservations that are not
								 * yet published; exclusive for a consistent
								 * allocator check */
	LWLock		writeback_lock; /* held by the write-back worker from taking
								 * pages off the dirty bitmap until they are
								 * written, and by a commit that skipped the
								 * WAL while it writes (amr_writeback.c) */
	ConditionVariable tier_cv;	/* a tree's tier lock was released */
	pg_atomic_uint32 attached;	/* DRAM tier built from the pool since the
								 * (re)start (amr_attach) */
	pg_atomic_uint32 finished;	/* what recovery leaves to amrtree is done */
	pg_atomic_uint32 replay_failed; /* WAL replay could not use the pool */
	slock_t		lineage_mutex;	/* the pool header's WAL extent */
	int			tree_tranche;
	int			leaf_tranche;
	uint64		pool_id;
	/* counters for amrtree_index_stats / monitoring */
	pg_atomic_uint64 rebuilds;
	AmrHealQueue heal;
} AmrSharedState;

extern AmrSharedState *amr_shared;
extern AmrStore amr_store;
extern LWLock *amr_tree_locks;
extern LWLock *amr_leaf_locks;
extern AmrSsdIo amr_ssd_io;		/* process-local; descriptor from the
								 * postmaster */
extern AmrBitmap *amr_leaf_cache_used;	/* DRAM copies of leaves (rule R6) */
extern AmrLeaf *amr_leaf_cache;
extern uint32 amr_leaf_cache_n;

/* ---- clean DRAM copies of SSD leaf images (amr_ssdcache.c) ---- */
extern uint32 amr_ssd_cache_nslots(void);
extern Size amr_ssd_cache_shmem_size(uint32 nslots);
extern void amr_ssd_cache_attach(char *base, uint32 nslots, bool init);
extern bool amr_ssd_cache_get(const AmrTree *t, uint32 leaf_id, uint64 word,
							  AmrLeaf *buf);
extern bool amr_ssd_cache_holds(uint32 leaf_id, uint64 word);
extern void amr_ssd_cache_count_device_reads(int n);
extern void amr_ssd_cache_put(const AmrTree *t, uint32 leaf_id, uint64 word,
							  const AmrLeaf *img);
extern void amr_ssd_cache_counters(uint64 *size_bytes, uint64 *hits,
								   uint64 *device_reads, uint64 *fills);

/* ---- write-back pools (amr_writeback.c) ---- */
extern bool amr_writeback_enabled;
extern int	amr_writeback_delay_ms;

/* Postmaster: use a DRAM copy of the pool file; false (logged) if impossible. */
extern bool amr_wb_start(const char *path, char *file_map, size_t file_size,
						 AmrPoolHeader *file_hdr);

/* The DRAM copy's base address (amr_wb_start succeeded). */
extern char *amr_wb_copy_base(void);

/* This server's pool is a write-back pool. */
extern bool amr_wb_active(void);

/* Postmaster, restarting its children after a crash: load the copy again. */
extern void amr_wb_reload(void);

/* Startup process, end of redo: sync what replay wrote, mark the file complete. */
extern void amr_wb_recovery_done(void);

/* Startup process: sync the pool when it exits during recovery. */
extern void amr_wb_recovery_register_exit(void);

/* Shared memory for dirty pages and change counters, and attaching to it. */
extern Size amr_wb_shmem_size(void);
extern void amr_wb_shmem_attach(char *base, bool init);

/* Around each logged change (amr_wal_hold/release_checkpoint). */
extern void amr_wb_change_begin(void);
extern void amr_wb_change_end(void);

/* A change is not logged because its index skips the WAL (wal_level = minimal). */
extern void amr_wb_note_wal_skipped(void);

/* Before commit or prepare: make this transaction's unlogged changes durable. */
extern void amr_wb_pre_commit(void);

/* At the end of a transaction: forget them. */
extern void amr_wb_end_of_xact(void);

/* Before writing the SSD slot file: the WAL that freed its slots is durable. */
extern void amr_wb_before_device_write(void);

/* Append the write-back state to a description of the pool. */
extern void amr_wb_describe(StringInfo buf);

/* At preload. */
extern void amr_wb_register_worker(void);

/* At preload: the shared memory request and startup hooks. */
extern void amr_shmem_init_hooks(void);

/* ---- the PMEM pool (amr_pool.c) ---- */

/* The configured pool path, for messages. */
extern const char *amr_pool_path_display(void);

/* The pool, its medium and persistence, and the SSD tier, in one line. */
extern void amr_pool_describe(StringInfo buf);

/* Postmaster: open or create the pool (and slot file) at startup. */
extern void amr_pool_open_at_start(void);

/* Postmaster: children are being restarted after a crash. */
extern void amr_pool_note_crash_restart(void);

/*
 * This start may replay WAL over a copy of the pool (a base backup, archive
 * recovery, a standby), not only over the pool this server last wrote.
 */
extern bool amr_pool_may_be_a_copy(void);

/* The pool opened and is usable. */
extern bool amr_pool_ready(void);

/* Raise the ERROR that says why the pool is not usable. */
extern void amr_pool_report_unusable(void);

/* Postmaster: record why the pool cannot be used (logged, raised at every use). */
extern void amr_pool_fail(const char *msg, const char *detail, const char *hint);

/* A random nonzero 64-bit identity. */
extern uint64 amr_random_id(void);

/* The directory of path exists, or is our own default one and is created. */
extern bool amr_prepare_parent_directory(const char *path, const char *setting);

/* Postmaster: lock fd's file exclusively, waiting a while for an exiting holder; 0 or an errno. */
extern int	amr_lock_file_waiting(int fd, const char *path);

/* ---- the SSD slot file (amr_slotfile.c) ---- */

/* Postmaster: validate, create or enlarge the slot file for pool hdr. */
extern bool amr_slotfile_open(const char *path, uint64 want_slots, AmrPoolHeader *hdr);
extern bool amr_slotfile_was_lost(void);
extern void amr_slotfile_forget_lock(void);

/* Slots an existing slot file declares (0 if none). */
extern uint64 amr_slotfile_peek_slots(const char *path);

/* Slots of the SSD tier (0: none). */
extern uint32 amr_slotfile_nslots(void);

/* Never use more SSD slots than the Leaf Table can name. */
extern void amr_slotfile_limit_slots(uint64 max_slots);

/* The slot file, for logs. */
extern const char *amr_slotfile_describe(void);

/*
 * Everything that touches an index starts here: errors out (with the reason)
 * when amrtree was not preloaded, the pool could not be opened, or WAL
 * replay could not use it; on first use after a (re)start or a recovery it
 * attaches the pool (unless replay did) and finishes what recovery leaves
 * to amrtree (amr_reconcile.c).
 */
extern void amr_require_ready(void);
extern bool amr_is_ready(void);
extern bool amr_is_reconciled(void);
extern bool amr_pool_is_open(void);

/* Was the pool created at this server start (amr_pool.c)? */
extern bool amr_pool_created_at_start(void);

/* ---- reconciliation (amr_reconcile.c) ---- */

/*
 * Build the DRAM tier from the pool, reading no catalog and writing no WAL
 * (the startup process runs it before replay, with before_replay set).
 */
extern void amr_attach(bool before_replay);

/* Rebuild tree t's inner nodes and counts from the Leaf Table (tree held exclusively). */
extern void amr_tree_rebuild_inner(AmrTree *t);

/* Postmaster, at an unclean start: entries beyond the last checkpoint are suspect. */
extern void amr_note_unclean_start(XLogRecPtr last_checkpoint);

/* Startup process, at the end of redo: entries beyond replay_end are pruned. */
extern void amr_note_replay_end(XLogRecPtr replay_end);

/* ---- where the pool's contents come from (amr_lineage.c) ---- */
/* Record that a change logged by a record ending at end (timeline tli) may reach the pool; false if replay gave the pool up. */
extern bool amr_lineage_note(XLogRecPtr end, TimeLineID tli, bool replaying);

/* Postmaster, loading a file replay had not synced before a reboot: raise its extent to the end of pg_wal's WAL. */
extern void amr_lineage_after_unsynced_replay(AmrPoolHeader *hdr, XLogRecPtr from);

/* Postmaster, pool opened: refuse a pool this data directory's WAL does not lead to. */
extern void amr_lineage_at_open(const ControlFileData *cf, bool replay_from_copy,
								bool upgraded);

/*
 * Postmaster, restarting its children after a crash: the lost tail is not
 * another life; a standby's pool is ahead of where replay resumes.
 */
extern void amr_lineage_at_crash_restart(const ControlFileData *cf,
										 bool replay_from_copy);

/* Startup process, redo starting: false if the target timeline rules the pool out. */
extern bool amr_lineage_at_redo_start(void);

/* Hot standby: has replay passed the extent of the pool it started on (*position)? */
extern bool amr_lineage_replay_caught_up(XLogRecPtr *position);

/* Startup process, redo ended: the replayed WAL must have reached the pool's extent. */
extern void amr_lineage_at_redo_end(void);

/* ---- tree directory and lifecycle (amr_directory.c) ---- */

#define AMR_META_MAGIC		0x4d524d41	/* "AMRM" */
#define AMR_META_VERSION	1

/* The tree_no of a metapage that names no tree (built under pg_upgrade). */
#define AMR_NO_TREE			UINT32_MAX

typedef struct AmrMetaPageData
{
	uint32		magic;
	uint32		version;
	uint64		pool_id;
	uint32		tree_no;
	uint32		tree_generation;
	Oid			db_oid;
	Oid			relfilenode;
} AmrMetaPageData;

/*
 * What a backend caches in rd_amcache once the metapage was read: the tree,
 * and the placement options parsed (the relcache entry, with this, is
 * rebuilt when ALTER INDEX ... SET changes them).
 */
typedef struct AmrRelCache
{
	uint32		tree_no;
	uint32		generation;
	AmrBudgetKind budget_kind;
	double		budget_value;
	bool		tiering;
} AmrRelCache;

/* Create the tree of an index being built: BUILDING until this transaction commits. */
extern uint32 amr_tree_create(Relation index, bool unlogged);

/* Write the metapage naming the index's tree into block 0 of fork. */
extern void amr_metapage_write(Relation index, ForkNumber fork, uint32 tree_no);

/* The index's tree, or the "has no tree ... REINDEX" ERROR. */
extern AmrTree *amr_tree_open(Relation index);

/* Build t's inner nodes if WAL replay left them stale (no lock held on entry or exit). */
extern void amr_tree_pack_if_stale(AmrTree *t);

/* The index's tree, or NULL if it has none and missing_ok. */
extern AmrTree *amr_tree_open_extended(Relation index, bool missing_ok);

/* What this server holds for an index (amr_tree_lookup). */
typedef enum AmrTreeUse
{
	AMR_USE_OK,					/* a tree this server maintains */
	AMR_USE_LOST,				/* none, for good: only a rebuild helps */
	AMR_USE_DAMAGED				/* WAL replay could not keep it up to date */
} AmrTreeUse;

extern AmrTree *amr_tree_lookup(Relation index, AmrTreeUse *state);

/* ---- indexes that lost their tree (amr_heal.c) ---- */
extern bool amr_auto_rebuild;

/* Install the planner hook that hides indexes without a usable tree. */
extern void amr_heal_register_hooks(void);

/* The tree to insert into or vacuum, or NULL: skip the index (rebuild requested). */
extern AmrTree *amr_tree_open_for_write(Relation index);

/* Ask the tier manager to rebuild the lost trees of one database / of all. */
extern void amr_heal_request(Oid dbid);
extern void amr_heal_request_all(void);

/* Tier manager: start the next requested rebuild worker, if none runs. */
extern void amr_heal_launch_pending(void);

extern PGDLLEXPORT void amr_rebuild_worker_main(Datum main_arg);

/* Object access hook: a relation was created (a rebuild notes its copy). */
extern void amr_heal_note_created(Oid relid);

/* ---- planner support functions that serve only GiST (amr_plan.c) ---- */

/* Install the planner hook that lets them serve amrtree's twin families. */
extern void amr_plan_register_hooks(void);

/* At preload: the drop and utility hooks and the transaction callbacks. */
extern void amr_directory_register_hooks(void);

/* Free every leaf of a tree and its record (commit callbacks: no ERROR). */
extern void amr_tree_free_storage(uint32 tree_no);

/*
 * Mark a tree unusable on this server (WAL replay could not follow it, or
 * did not restore a leaf): using its index raises an ERROR asking for
 * REINDEX.  Persisted in its record.
 */
extern void amr_tree_mark_broken(uint32 tree_no);

/* Return a tree's inner nodes and reset its DRAM descriptor. */
extern void amr_tree_reset_dram(AmrTree *t);

/*
 * Predicate locks (SERIALIZABLE) are taken, as GiST takes them on pages, on
 * every inner node and leaf a scan reads, under "block numbers" that name
 * them stably: a leaf by its logical id (which migrations and rewrites
 * keep), an inner node by its index in the DRAM arena, in a range of its
 * own.  Block 0 is the metapage.  Readers lock before they read; writers
 * check after they change (see amr_insert.c), which is what makes the
 * scheme safe although inserts widen inner boxes under a shared tree lock.
 */
#define AMR_PRED_NODE_BASE		((BlockNumber) 0xC0000000)

static inline BlockNumber
amr_pred_leaf_block(uint32 leaf_id)
{
	return (BlockNumber) leaf_id + 1;
}

static inline BlockNumber
amr_pred_node_block(uint32 node_id)
{
	return AMR_PRED_NODE_BASE + node_id;
}

static inline LWLock *
amr_tree_lock(const AmrTree *t)
{
	return &amr_tree_locks[t->tree_no];
}

static inline LWLock *
amr_leaf_lock(uint32 leaf_id)
{
	return &amr_leaf_locks[leaf_id];
}

/* ---- SSD slot I/O (amr_ssdio.c; the leaf store is its user) ---- */

/* Read n slots into 4 KiB-aligned buffers with one submission; ERROR on failure. */
extern void amr_ssd_read_images(Relation index, const uint32 *slots, AmrLeaf **bufs, int n);

/* Seal (checksum) and write n images with one submission; synced if sync. */
extern void amr_ssd_write_images(Relation index, const uint32 *slots, AmrLeaf **imgs,
								 int n, bool sync);

/* Make every SSD write so far durable. */
extern void amr_ssd_flush(Relation index);

/* ---- scan pins (amr_pins.c) ---- */

/* Pin a leaf whose matches a scan is returning: VACUUM waits for it. */
extern void amr_pin_leaf(AmrTree *t, uint32 leaf_id);

/* Drop this backend's pin on a leaf. */
extern void amr_unpin_leaf(AmrTree *t, uint32 leaf_id);

/* Wait until no scan pins the leaf (VACUUM, at every leaf it visits). */
extern void amr_wait_for_unpin(AmrTree *t, uint32 leaf_id);

/*
 * A pass that removes entries of t (VACUUM's, or the replay of one record
 * of it) begins: before its first removal.  Returns the pass's number, for
 * amr_removal_pass_end.
 */
extern uint64 amr_removal_pass_begin(AmrTree *t);

/* The pass numbered "pass" is over (also when it failed half-way). */
extern void amr_removal_pass_end(AmrTree *t, uint64 pass);

/* Removal passes begun on t, and the number of the last one finished. */
#define amr_removals_begun(t)		amr_sync_read(&(t)->removals_begun)
#define amr_removals_finished(t)	amr_sync_read(&(t)->removals_finished)

/*
 * Replay, after removing entries from a leaf of t or marking them dead:
 * wait for the hot-standby scans pinning it (or a leaf its entries came
 * from), cancelling them past the standby delay.
 */
extern void amr_redo_wait_for_unpin(AmrTree *t, uint32 leaf_id);

/* Replay, after a split: remember where the right half's entries came from. */
extern void amr_redo_note_split(uint32 left_leaf, uint32 right_leaf);

/* At preload: pins are released with their resource owner, or at transaction end. */
extern void amr_pins_register_callbacks(void);

/* Shared memory for who holds pins (one entry per PGPROC). */
extern Size amr_pins_shmem_size(void);
extern void amr_pins_shmem_attach(char *base, bool init);

/* ---- tier manager (amr_tier.c) ---- */
/* Take the tier lock of a tree (interruptible wait); see amr_tier.c. */
extern void amr_tier_lock(AmrTree *t);

/* Take the tier lock of a tree if no one holds it; returns whether it did. */
extern bool amr_tier_trylock(AmrTree *t);

/* Release the tier lock this process holds, if any (also in abort paths). */
extern void amr_tier_unlock(void);

/* At preload: a backend's tier lock goes when its transaction aborts. */
extern void amr_tier_register_callbacks(void);
extern uint64 amr_tier_cycle_tree(AmrTree *t);
extern double amr_now_seconds(void);
extern void amr_register_worker(void);


/* name for messages: the index, or the tree number when no relation is open */
extern const char *amr_index_name(Relation index, const AmrTree *t);

/*
 * ---- AM callbacks ----
 *
 * The index access method interface (access/amapi.h), each in the file of
 * its phase: build, insert, scan, vacuum, cost, validate, options.
 */
extern IndexBuildResult *amrbuild(Relation heap, Relation index,
								  struct IndexInfo *indexInfo);
extern void amrbuildempty(Relation index);
extern char *amrbuildphasename(int64 phasenum);
extern bool amrinsert(Relation index, Datum *values, bool *isnull,
					  ItemPointer ht_ctid, Relation heapRel,
					  IndexUniqueCheck checkUnique, bool indexUnchanged,
					  struct IndexInfo *indexInfo);
extern void amr_insert_entry(Relation index, AmrTree *t,
							 const AmrLeafEntry *entry);
extern IndexScanDesc amrbeginscan(Relation r, int nkeys, int norderbys);
extern void amrrescan(IndexScanDesc scan, ScanKey scankey, int nscankeys,
					  ScanKey orderbys, int norderbys);
extern bool amrgettuple(IndexScanDesc scan, ScanDirection dir);
extern int64 amrgetbitmap(IndexScanDesc scan, TIDBitmap *tbm);
extern void amrendscan(IndexScanDesc scan);
extern bool amrcanreturn(Relation index, int attno);
extern IndexBulkDeleteResult *amrbulkdelete(IndexVacuumInfo *info,
											IndexBulkDeleteResult *stats,
											IndexBulkDeleteCallback callback,
											void *callback_state);
extern IndexBulkDeleteResult *amrvacuumcleanup(IndexVacuumInfo *info,
											   IndexBulkDeleteResult *stats);
extern void amrcostestimate(PlannerInfo *root, IndexPath *path,
							double loop_count, Cost *indexStartupCost,
							Cost *indexTotalCost, Selectivity *indexSelectivity,
							double *indexCorrelation, double *indexPages);
extern bool amrvalidate(Oid opclassoid);
extern bool amrproperty(Oid index_oid, int attno, IndexAMProperty prop,
						const char *propname, bool *res, bool *isnull);
extern bytea *amroptions(Datum reloptions, bool validate);

/* ---- keys and operator classes (amr_opclass.c) ---- */

/* Support function 1: the bounding box of a value (T -> box). */
#define AMR_BBOX_PROC				1
/* Support function 2 (optional): the value a key box represents (box -> T). */
#define AMR_FETCH_PROC				2
/*
 * Support function 3 (optional): a lower bound of the ordering operator's
 * distance between any value whose key lies in the first box and a query
 * whose box is the second ((box, box) -> float8), for keys that are not
 * planar (amrtree_geography_distance); without it, the planar distance.
 */
#define AMR_DISTANCE_PROC			3

/* GiST's strategy numbers beyond the twelve box relations (point_ops) */
#define AMR_STRAT_POINT_IN_BOX		28	/* point <@ box */
#define AMR_STRAT_OLD_BELOW			29	/* point <^ point */
#define AMR_STRAT_OLD_ABOVE			30	/* point >^ point */
#define AMR_STRAT_POINT_IN_POLYGON	48	/* point <@ polygon */
#define AMR_STRAT_POINT_IN_CIRCLE	68	/* point <@ circle */

/*
 * Ordering strategies: 15 (GiST's "<->"), and 13 and 14, PostGIS's numbers
 * for "<->" and "<#>"; all mean "distance from the key to the query value".
 */
static inline bool
amr_is_ordering_strategy(int strategy)
{
	return strategy >= 13 && strategy <= 15;
}

/* The box relation (1-12) a search strategy filters by; 0 if none. */
extern int	amr_strategy_relation(int strategy);

/* Whether keys are the indexed values themselves (box_ops), not bounding boxes. */
extern bool amr_opclass_exact(Relation index);

/* Whether a key determines the indexed value: box_ops, or support function 2. */
extern bool amr_opclass_keys_exact(Relation index);

/* The indexed value a key stands for (only where amr_opclass_keys_exact). */
extern Datum amr_key_value(Relation index, const AmrBox *key);

/*
 * Turn an indexed value into a leaf key: the box itself, or its bounding
 * box from support function 1.  Every box is accepted, as GiST accepts it:
 * infinite coordinates, and NaN ones (see amr_fbox_from_box).
 */
extern void amr_box_from_datum(Relation index, Datum d, AmrBox *out);

/*
 * The box of a query argument of type argtype: a box, an indexed value, or
 * a value that support function 1 of its own type in the operator family
 * maps (cache, if not NULL, keeps that function in cxt across calls).
 * argtype is a type: a PostgreSQL scan key without a subtype (an exclusion
 * constraint's) holds a value of the indexed type, which amrrescan says.
 */
/*
 * geography_ops' distance bound (an AmrKnnBoundFn), and whether fn is the
 * SQL function that computes it (amr_geography.c).
 */
extern double amr_geography_bound(const AmrFBox *b, const AmrBox *q, void *arg);
extern bool amr_is_geography_bound(const FmgrInfo *fn);

extern void amr_query_box(Relation index, Oid argtype, Datum arg,
						  FmgrInfo *cache, MemoryContext cxt, AmrBox *out);

/*
 * Fill a core scan key for "indexed <strategy> arg"; returns whether the
 * filter is lossy (the executor must recheck the operator).
 */
extern bool amr_scankey_from_pg(Relation index, int strategy, Oid argtype,
								Datum arg, FmgrInfo *cache, MemoryContext cxt,
								AmrScanKey *k);

/* Store a core key into a PostgreSQL box. */
static inline void
amr_box_set_pg(BOX *p, const AmrBox *b)
{
	p->low.x = b->xlo;
	p->low.y = b->ylo;
	p->high.x = b->xhi;
	p->high.y = b->yhi;
}

/* A core key as a palloc'd PostgreSQL box. */
static inline BOX *
amr_box_to_pg(const AmrBox *b)
{
	BOX		   *p = (BOX *) palloc(sizeof(BOX));

	amr_box_set_pg(p, b);
	return p;
}

/* A PostgreSQL box as a core key. */
static inline void
amr_box_from_pg(const BOX *p, AmrBox *b)
{
	b->xlo = p->low.x;
	b->ylo = p->low.y;
	b->xhi = p->high.x;
	b->yhi = p->high.y;
}

/* End of the WAL inserted so far, recorded in every entry (docs/design.md, "No phantom rows"). */
extern XLogRecPtr amr_insert_lsn(void);

/* ---- crash points for tests (amr_fault.c) ---- */
extern char *amr_fault_injection;
extern void amr_fault_define_guc(void);

#endif							/* AMRTREE_H */
