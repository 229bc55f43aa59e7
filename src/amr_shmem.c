/*-------------------------------------------------------------------------
 *
 * amr_shmem.c
 *		The DRAM tier: the shared memory amrtree requests, its layout, and
 *		the hooks that request it (opening the pool first, whose size
 *		decides it) and attach every process to it.
 *
 * Nothing here is persistent: the per-tree descriptors and locks, the
 * per-leaf volatile state and locks, the free bitmaps, the inner-node arena
 * (amrtree.dram_size), the DRAM copies of rule R6 and the SSD cache are
 * rebuilt or refilled after every (re)start (amr_reconcile.c).
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"

AmrSharedState *amr_shared = NULL;
AmrStore	amr_store;
LWLock	   *amr_tree_locks = NULL;
LWLock	   *amr_leaf_locks = NULL;
AmrBitmap  *amr_leaf_cache_used = NULL;
AmrLeaf    *amr_leaf_cache = NULL;
uint32		amr_leaf_cache_n = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static int	shmem_startups = 0;

typedef struct AmrShmemLayout
{
	Size		total;
	Size		off_tree_locks;
	Size		off_trees;
	Size		off_leaf_locks;
	Size		off_leaves;
	Size		off_pmem_bitmap;
	Size		off_ids_bitmap;
	Size		off_nodes_bitmap;
	Size		off_nodes;
	uint32		nnodes;
	Size		off_ssd_bitmap;
	Size		off_cache_bitmap;
	Size		off_cache;
	uint32		ncache;
	Size		off_ssd_cache;
	Size		off_writeback;
	Size		off_pins;
	uint32		nssd_cache;
} AmrShmemLayout;

static void
compute_layout(AmrShmemLayout *l)
{
	uint32		lt = amr_pool_ready() ? amr_store.lt_capacity : 0;
	uint32		slots = amr_pool_ready() ? amr_store.pmem_nslots : 0;
	Size		off = MAXALIGN(sizeof(AmrSharedState));
	Size		node_bytes;

	l->off_tree_locks = off;
	off = CACHELINEALIGN(off + sizeof(LWLock) * AMR_MAX_TREES);
	l->off_trees = off;
	off = CACHELINEALIGN(off + sizeof(AmrTree) * AMR_MAX_TREES);
	l->off_leaf_locks = off;
	off = CACHELINEALIGN(off + sizeof(LWLock) * (Size) lt);
	l->off_leaves = off;
	off = CACHELINEALIGN(off + sizeof(AmrLeafVolatile) * (Size) lt);
	l->off_pmem_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(slots));
	l->off_ids_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(lt));
	l->off_ssd_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(amr_pool_ready() ? amr_slotfile_nslots() : 0));

	/* DRAM copies of leaves held by rule R6, 4 KiB aligned for O_DIRECT */
	l->ncache = amr_pool_ready() ?
		(uint32) ((Size) amr_dram_leaf_cache_kb * 1024 / AMR_SLOT_SIZE) : 0;
	l->off_cache_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(l->ncache));
	off = TYPEALIGN(AMR_SLOT_SIZE, off);
	l->off_cache = off;
	off += (Size) l->ncache * AMR_SLOT_SIZE;

	/* clean copies of SSD leaf images (amr_ssdcache.c), 4 KiB aligned */
	l->nssd_cache = amr_pool_ready() && amr_slotfile_nslots() > 0 ?
		amr_ssd_cache_nslots() : 0;
	l->off_ssd_cache = off;
	off += amr_ssd_cache_shmem_size(l->nssd_cache);

	/* dirty pages of a write-back pool (amr_writeback.c) */
	off = CACHELINEALIGN(off);
	l->off_writeback = off;
	off += amr_wb_shmem_size();

	/* who holds scan pins (amr_pins.c) */
	off = CACHELINEALIGN(off);
	l->off_pins = off;
	off += amr_pins_shmem_size();

	/* inner nodes: amrtree.dram_size */
	node_bytes = amr_pool_ready() ? (Size) amr_dram_size_kb * 1024 : 0;
	l->nnodes = (uint32) Min(node_bytes / sizeof(AmrInnerNode), (Size) UINT32_MAX - 1);
	l->off_nodes_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(l->nnodes));
	l->off_nodes = off;
	off = CACHELINEALIGN(off + sizeof(AmrInnerNode) * (Size) l->nnodes);
	/* ShmemInitStruct's result is only cache-line aligned */
	l->total = off + AMR_SLOT_SIZE;
}

static void
amr_shmem_request(void)
{
	AmrShmemLayout layout;

	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	amr_pool_open_at_start();
	compute_layout(&layout);
	RequestAddinShmemSpace(layout.total);
}

static void
amr_shmem_startup(void)
{
	AmrShmemLayout layout;
	bool		found;
	char	   *base;
	uint32		i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	compute_layout(&layout);
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	base = ShmemInitStruct("amrtree", layout.total, &found);
	/* align the whole layout so that the leaf cache is 4 KiB aligned */
	base = (char *) TYPEALIGN(AMR_SLOT_SIZE, base);
	amr_shared = (AmrSharedState *) base;
	amr_tree_locks = (LWLock *) (base + layout.off_tree_locks);
	amr_leaf_locks = (LWLock *) (base + layout.off_leaf_locks);
	amr_store.trees = (AmrTree *) (base + layout.off_trees);
	amr_store.leaves = (AmrLeafVolatile *) (base + layout.off_leaves);
	amr_store.pmem_used = (AmrBitmap *) (base + layout.off_pmem_bitmap);
	amr_store.ssd_used = amr_slotfile_nslots() > 0 ? (AmrBitmap *) (base + layout.off_ssd_bitmap) : NULL;
	amr_store.ssd_nslots = amr_pool_ready() ? amr_slotfile_nslots() : 0;
	amr_leaf_cache_used = (AmrBitmap *) (base + layout.off_cache_bitmap);
	amr_leaf_cache = (AmrLeaf *) (base + layout.off_cache);
	amr_leaf_cache_n = layout.ncache;
	amr_ssd_cache_attach(base + layout.off_ssd_cache, layout.nssd_cache, !found);
	amr_wb_shmem_attach(base + layout.off_writeback, !found);
	amr_pins_shmem_attach(base + layout.off_pins, !found);
	amr_store.leaf_ids_used = (AmrBitmap *) (base + layout.off_ids_bitmap);
	amr_store.nodes_used = (AmrBitmap *) (base + layout.off_nodes_bitmap);
	amr_store.nodes = (AmrInnerNode *) (base + layout.off_nodes);
	amr_store.nnodes = layout.nnodes;

	if (!found)
	{
		uint32		lt = amr_pool_ready() ? amr_store.lt_capacity : 0;
		uint32		slots = amr_pool_ready() ? amr_store.pmem_nslots : 0;

		memset(amr_shared, 0, sizeof(AmrSharedState));
		amr_shared->tree_tranche = LWLockNewTrancheId();
		amr_shared->leaf_tranche = LWLockNewTrancheId();
		LWLockInitialize(&amr_shared->directory_lock, amr_shared->tree_tranche);
		LWLockInitialize(&amr_shared->attach_lock, amr_shared->tree_tranche);
		LWLockInitialize(&amr_shared->publish_lock, amr_shared->tree_tranche);
		LWLockInitialize(&amr_shared->writeback_lock, amr_shared->tree_tranche);
		ConditionVariableInit(&amr_shared->tier_cv);
		pg_atomic_init_u32(&amr_shared->attached, 0);
		pg_atomic_init_u32(&amr_shared->finished, 0);
		pg_atomic_init_u32(&amr_shared->replay_failed, 0);
		pg_atomic_init_u64(&amr_shared->rebuilds, 0);
		SpinLockInit(&amr_shared->heal.mutex);
		SpinLockInit(&amr_shared->lineage_mutex);
		/* a restart of the postmaster's children is always a crash */
		if (shmem_startups > 0)
			amr_pool_note_crash_restart();
		amr_shared->pool_id = amr_pool_ready() ? amr_store.header->pool_id : 0;

		for (i = 0; i < AMR_MAX_TREES; i++)
		{
			LWLockInitialize(&amr_tree_locks[i], amr_shared->tree_tranche);
			amr_tree_descriptor_init(&amr_store.trees[i], i, NULL);
		}
		for (i = 0; i < lt; i++)
			LWLockInitialize(&amr_leaf_locks[i], amr_shared->leaf_tranche);
		memset(amr_store.leaves, 0, sizeof(AmrLeafVolatile) * (Size) lt);
		amr_bitmap_init(amr_store.pmem_used, slots);
		amr_bitmap_init(amr_store.leaf_ids_used, lt);
		amr_bitmap_init(amr_store.nodes_used, layout.nnodes);
		if (amr_store.ssd_used)
			amr_bitmap_init(amr_store.ssd_used, amr_store.ssd_nslots);
		amr_bitmap_init(amr_leaf_cache_used, layout.ncache);
	}
	LWLockRelease(AddinShmemInitLock);

	LWLockRegisterTranche(amr_shared->tree_tranche, "amrtree_tree");
	LWLockRegisterTranche(amr_shared->leaf_tranche, "amrtree_leaf");
	shmem_startups++;
}

void
amr_shmem_init_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = amr_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = amr_shmem_startup;
}

/*
 * The pool is usable and this server's reconciliation has run, so the DRAM
 * tier describes it: what commit callbacks need before freeing a tree.
 */
bool
amr_is_reconciled(void)
{
	return amr_is_ready() && pg_atomic_read_u32(&amr_shared->attached) != 0;
}

/*
 * amrtree can be used here and now: preloaded, pool usable, and -- on a hot
 * standby -- attached by WAL replay, which keeps it up to date, and past
 * the WAL extent of the pool it started on (amr_lineage.c).
 */
bool
amr_is_ready(void)
{
	XLogRecPtr	position;

	if (!amr_preloaded || amr_shared == NULL || !amr_pool_ready())
		return false;
	if (!RecoveryInProgress())
		return true;
	return pg_atomic_read_u32(&amr_shared->attached) != 0 &&
		pg_atomic_read_u32(&amr_shared->replay_failed) == 0 &&
		amr_lineage_replay_caught_up(&position);
}
