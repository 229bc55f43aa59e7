/*-------------------------------------------------------------------------
 *
 * amr_persist.c
 *		Cache-line write-back, fences and persisted copies for the PMEM tier.
 *
 * We issue the flush instructions ourselves instead of relying on
 * pmem_persist() because libpmem picks its instruction once, from the CPU and
 * environment variables read when the library is loaded, while
 * amrtree.persist_mode must select clwb, clflush or nothing at server start.
 * libpmem still provides the non-temporal copy loops and msync.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_persist.h"

#include <cpuid.h>
#include <string.h>
#include <libpmem.h>

#define AMR_CACHELINE 64
#define AMR_NT_THRESHOLD 256

AmrPersistMode amr_persist_mode = AMR_PERSIST_CLWB;
bool		(*amr_fault_hook) (const char *point) = NULL;
void		(*amr_persist_hook) (const void *addr, size_t len) = NULL;
void		(*amr_persist_batch_hook) (bool begin) = NULL;

typedef enum
{
	FLUSH_CLWB,
	FLUSH_CLFLUSHOPT,
	FLUSH_CLFLUSH,
	FLUSH_NONE,
	FLUSH_MSYNC,
	FLUSH_HOOK
} FlushInsn;

static FlushInsn flush_insn = FLUSH_CLFLUSH;

static bool
cpu_has_leaf7_ebx_bit(int bit)
{
	unsigned int eax,
				ebx,
				ecx,
				edx;

	if (__get_cpuid_max(0, NULL) < 7)
		return false;
	__cpuid_count(7, 0, eax, ebx, ecx, edx);
	return (ebx & (1u << bit)) != 0;
}

void
amr_persist_init(AmrPersistMode mode)
{
	amr_persist_mode = mode;
	switch (mode)
	{
		case AMR_PERSIST_CLWB:
			if (cpu_has_leaf7_ebx_bit(24))
				flush_insn = FLUSH_CLWB;
			else if (cpu_has_leaf7_ebx_bit(23))
				flush_insn = FLUSH_CLFLUSHOPT;
			else
				flush_insn = FLUSH_CLFLUSH;
			break;
		case AMR_PERSIST_CLFLUSH:
			flush_insn = FLUSH_CLFLUSH;
			break;
		case AMR_PERSIST_NOP:
			flush_insn = FLUSH_NONE;
			break;
		case AMR_PERSIST_MSYNC:
			flush_insn = FLUSH_MSYNC;
			break;
		case AMR_PERSIST_HOOK:
			flush_insn = FLUSH_HOOK;
			break;
	}
}

const char *
amr_persist_describe(void)
{
	switch (flush_insn)
	{
		case FLUSH_CLWB:
			return "clwb+sfence";
		case FLUSH_CLFLUSHOPT:
			return "clflushopt+sfence";
		case FLUSH_CLFLUSH:
			return "clflush+sfence";
		case FLUSH_NONE:
			return "none (nop mode: not crash safe)";
		case FLUSH_MSYNC:
			return "msync";
		case FLUSH_HOOK:
			return "write-back";
	}
	return "unknown";
}

/*
 * A batch (msync mode): flushes record the range they cover instead of
 * calling msync, and amr_persist_batch_end makes it durable with one call.
 * In hook mode the write-back layer batches by itself (amr_persist_batch_hook).
 * Only for writes whose order does not matter until the batch ends.
 */
static bool msync_batching = false;
static uintptr_t batch_lo;
static uintptr_t batch_hi;

void
amr_persist_batch_begin(void)
{
	if (flush_insn == FLUSH_HOOK)
	{
		amr_persist_batch_hook(true);
		return;
	}
	if (flush_insn != FLUSH_MSYNC)
		return;
	msync_batching = true;
	batch_lo = UINTPTR_MAX;
	batch_hi = 0;
}

void
amr_persist_batch_end(void)
{
	if (flush_insn == FLUSH_HOOK)
	{
		amr_persist_batch_hook(false);
		return;
	}
	if (!msync_batching)
		return;
	msync_batching = false;
	if (batch_hi > batch_lo)
		(void) pmem_msync((const void *) batch_lo, batch_hi - batch_lo);
}

void
amr_flush(const void *addr, size_t len)
{
	uintptr_t	p = (uintptr_t) addr & ~(uintptr_t) (AMR_CACHELINE - 1);
	uintptr_t	end = (uintptr_t) addr + len;

	if (len == 0)
		return;
	switch (flush_insn)
	{
		case FLUSH_CLWB:
			for (; p < end; p += AMR_CACHELINE)
				__asm__ volatile ("clwb %0":"+m" (*(volatile char *) p));

			break;
		case FLUSH_CLFLUSHOPT:
			for (; p < end; p += AMR_CACHELINE)
				__asm__ volatile ("clflushopt %0":"+m" (*(volatile char *) p));

			break;
		case FLUSH_CLFLUSH:
			for (; p < end; p += AMR_CACHELINE)
				__asm__ volatile ("clflush %0":"+m" (*(volatile char *) p));

			break;
		case FLUSH_NONE:
			break;
		case FLUSH_HOOK:
			amr_persist_hook(addr, len);
			break;
		case FLUSH_MSYNC:
			if (msync_batching)
			{
				if ((uintptr_t) addr < batch_lo)
					batch_lo = (uintptr_t) addr;
				if (end > batch_hi)
					batch_hi = end;
				break;
			}
			/* pmem_msync page-aligns the range itself */
			(void) pmem_msync(addr, len);
			break;
	}
}

void
amr_drain(void)
{
	if (flush_insn == FLUSH_NONE)
		return;
	__asm__ volatile ("sfence":::"memory");
}

void
amr_persist(const void *addr, size_t len)
{
	amr_flush(addr, len);
	amr_drain();
}

void
amr_memcpy_nodrain(void *dst, const void *src, size_t len)
{
	if (flush_insn == FLUSH_NONE)
	{
		memcpy(dst, src, len);
		return;
	}
	if (flush_insn == FLUSH_MSYNC || flush_insn == FLUSH_HOOK || len < AMR_NT_THRESHOLD)
	{
		memcpy(dst, src, len);
		amr_flush(dst, len);
		return;
	}
	pmem_memcpy(dst, src, len, PMEM_F_MEM_NONTEMPORAL | PMEM_F_MEM_NODRAIN);
}

void
amr_memcpy_persist(void *dst, const void *src, size_t len)
{
	amr_memcpy_nodrain(dst, src, len);
	amr_drain();
}

void
amr_store_persist_u64(volatile uint64_t *addr, uint64_t value)
{
	__atomic_store_n(addr, value, __ATOMIC_RELEASE);
	amr_persist((const void *) addr, sizeof(uint64_t));
}
