/*-------------------------------------------------------------------------
 *
 * amr_persist.h
 *		Making stores to the PMEM pool durable.
 *
 * A pool on real PMEM (DAX) or on a DRAM-backed file system (the emulation
 * used when no PMEM exists) is made durable with cache-line write-back and a
 * store fence; a pool on an ordinary disk file needs msync.  The mode is a
 * process-wide setting chosen once at startup.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_PERSIST_H
#define AMR_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum AmrPersistMode
{
	AMR_PERSIST_CLWB,			/* clwb (clflushopt, clflush if absent) +
								 * sfence */
	AMR_PERSIST_CLFLUSH,		/* clflush + sfence */
	AMR_PERSIST_NOP,			/* no flush, no fence: measurement only,
								 * unsafe */
	AMR_PERSIST_MSYNC,			/* pool is on a disk file: msync */
	AMR_PERSIST_HOOK			/* pool is a DRAM copy of a disk file: the
								 * write-back layer decides (amr_persist_hook) */
} AmrPersistMode;

/*
 * In AMR_PERSIST_HOOK mode every flush of [addr, addr+len) goes here
 * (src/amr_writeback.c): mark the pages dirty for background write-back, or
 * write them through to the file.
 */
extern void (*amr_persist_hook) (const void *addr, size_t len);

/* In AMR_PERSIST_HOOK mode, amr_persist_batch_begin (true) and _end (false). */
extern void (*amr_persist_batch_hook) (bool begin);

extern AmrPersistMode amr_persist_mode;

/* Choose how stores are made durable (CPU flush instructions, msync, none). */
extern void amr_persist_init(AmrPersistMode mode);

/* The persistence chosen, for logs ("clwb+sfence", ...). */
extern const char *amr_persist_describe(void);

/* Write back the cache lines covering [addr, addr+len); no fence. */
extern void amr_flush(const void *addr, size_t len);

/* Order all previous flushes and non-temporal stores before later stores. */
extern void amr_drain(void);

/* flush + drain */
extern void amr_persist(const void *addr, size_t len);

/*
 * Copy and persist.  Copies of 256 bytes and more use non-temporal stores
 * (they bypass the cache, so no write-back is needed), following the PMEM
 * write discipline of the seed papers.
 */
extern void amr_memcpy_persist(void *dst, const void *src, size_t len);

/* As amr_memcpy_persist but without the final drain (batch with amr_drain). */
extern void amr_memcpy_nodrain(void *dst, const void *src, size_t len);

/* Atomic, persisted 8-byte store: the commit point primitive. */
extern void amr_store_persist_u64(volatile uint64_t *addr, uint64_t value);

/*
 * Between these two, in msync and hook modes (a pool on a disk file), persists only
 * note their range and the end makes it all durable with one msync; other
 * modes are unaffected.  For a process's writes whose relative order does
 * not matter until the end (a build: its tree is BUILDING, and a crash
 * discards it whatever reached the file).
 */
extern void amr_persist_batch_begin(void);
extern void amr_persist_batch_end(void);

/*
 * Crash points for failure-atomicity tests (amrtree.fault_injection).  Every
 * persist and every commit-point switch has one on each side; the hook is
 * NULL unless a test armed a point, so a disarmed point costs one
 * well-predicted branch.  The names are "operation:point" and are listed in
 * src/amr_fault.c, which also implements the hook.
 */
extern bool (*amr_fault_hook) (const char *point);

#define AMR_FAULT_POINT(name) \
	do { \
		if (__builtin_expect(amr_fault_hook != NULL, 0)) \
			(void) amr_fault_hook(name); \
	} while (0)

/* Is a simulated condition (such as "no free slot") armed? */
#define AMR_FAULT_ACTIVE(name) \
	(__builtin_expect(amr_fault_hook != NULL, 0) && amr_fault_hook(name))

#endif							/* AMR_PERSIST_H */
