/*-------------------------------------------------------------------------
 *
 * amr_check.c
 *		Structural invariants of the DRAM part of a tree against the Leaf
 *		Table (the part of amrtree_check() that needs no leaf contents).
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"

#include <stdio.h>
#include <string.h>

typedef struct CheckState
{
	const AmrStore *s;
	const AmrTree *t;
	uint8_t    *seen;
	char	   *buf;
	size_t		buflen;
	uint64_t	nodes;
	bool		failed;
} CheckState;

static void
check_fail(CheckState *cs, const char *fmt, unsigned long a, unsigned long b,
		   unsigned long c)
{
	if (cs->failed)
		return;
	cs->failed = true;
	snprintf(cs->buf, cs->buflen, fmt, a, b, c);
}

static void
check_node(CheckState *cs, uint32_t node_id, int expected_level, bool nulls)
{
	const AmrInnerNode *n;
	int			i;

	if (cs->failed)
		return;
	if (node_id >= cs->s->nnodes || !amr_bitmap_test(cs->s->nodes_used, node_id))
	{
		check_fail(cs, "Inner node %lu is not allocated (expected level %lu)",
				   node_id, expected_level, 0);
		return;
	}
	n = &cs->s->nodes[node_id];
	cs->nodes++;
	if (n->level != expected_level)
	{
		check_fail(cs, "Inner node %lu has level %lu, expected %lu",
				   node_id, n->level, expected_level);
		return;
	}
	if (n->count > AMR_INNER_FANOUT)
	{
		check_fail(cs, "Inner node %lu has %lu entries, more than the fan-out %lu",
				   node_id, n->count, AMR_INNER_FANOUT);
		return;
	}
	for (i = 0; i < n->count && !cs->failed; i++)
	{
		AmrFBox		box = amr_node_entry_box(n, i);

		if (n->level > 1)
		{
			AmrFBox		child_union;

			check_node(cs, n->child[i], expected_level - 1, nulls);
			if (cs->failed)
				return;
			child_union = amr_node_union(&cs->s->nodes[n->child[i]]);
			if (!nulls && !amr_fbox_is_empty(&child_union) &&
				!amr_fbox_covers(&box, &child_union))
				check_fail(cs, "Entry %lu of inner node %lu does not cover its child node %lu",
						   i, node_id, n->child[i]);
		}
		else
		{
			uint32_t	leaf = n->child[i];
			uint64_t	word;
			const AmrLeafTableEntry *e;

			if (leaf >= cs->s->lt_capacity)
			{
				check_fail(cs, "Inner node %lu references leaf id %lu beyond the Leaf Table capacity %lu",
						   node_id, leaf, cs->s->lt_capacity);
				return;
			}
			if (cs->seen[leaf])
			{
				check_fail(cs, "Leaf %lu is reachable more than once (again from inner node %lu)",
						   leaf, node_id, 0);
				return;
			}
			cs->seen[leaf] = 1;
			e = &cs->s->lt[leaf];
			word = amr_lt_word(cs->s, leaf);
			if (AMR_WORD_TIER(word) == AMR_TIER_NONE)
			{
				check_fail(cs, "Inner node %lu references leaf %lu, which the Leaf Table marks free",
						   node_id, leaf, 0);
				return;
			}
			if (e->tree_no != cs->t->tree_no || e->tree_generation != cs->t->generation)
			{
				check_fail(cs, "Leaf %lu belongs to tree %lu in the Leaf Table, but is reachable from tree %lu",
						   leaf, e->tree_no, cs->t->tree_no);
				return;
			}
			if (((e->flags & AMR_LT_FLAG_NULLS) != 0) != nulls)
			{
				check_fail(cs, "Leaf %lu is in the wrong half of the tree (NULL flag %lu)",
						   leaf, (e->flags & AMR_LT_FLAG_NULLS) != 0, 0);
				return;
			}
			if (!nulls)
			{
				AmrFBox		ltbox = amr_lt_mbr(cs->s, leaf, word);

				if (!amr_fbox_is_empty(&ltbox) && !amr_fbox_covers(&box, &ltbox))
					check_fail(cs, "Entry %lu of level-1 node %lu does not cover the Leaf Table box of leaf %lu",
							   i, node_id, leaf);
			}
		}
	}
}

const char *
amr_check_tree(const AmrStore *s, const AmrTree *t, uint8_t *seen_scratch,
			   char *buf, size_t buflen)
{
	CheckState	cs = {s, t, seen_scratch, buf, buflen, 0, false};
	uint32_t	id;

	memset(seen_scratch, 0, s->lt_capacity);
	if (t->root == AMR_INVALID_NODE || t->null_root == AMR_INVALID_NODE)
	{
		snprintf(buf, buflen, "Tree %u has not been built", t->tree_no);
		return buf;
	}
	if (t->height < 1 || t->height > AMR_MAX_HEIGHT ||
		t->null_height < 1 || t->null_height > AMR_MAX_HEIGHT)
	{
		snprintf(buf, buflen, "Tree %u has an impossible height %u/%u",
				 t->tree_no, t->height, t->null_height);
		return buf;
	}
	check_node(&cs, t->root, (int) t->height, false);
	check_node(&cs, t->null_root, (int) t->null_height, true);
	if (cs.failed)
		return buf;

	for (id = 0; id < s->lt_capacity; id++)
	{
		const AmrLeafTableEntry *e = &s->lt[id];
		uint64_t	word = amr_lt_word(s, id);

		if (AMR_WORD_TIER(word) == AMR_TIER_NONE ||
			e->tree_no != t->tree_no || e->tree_generation != t->generation)
			continue;
		if (!seen_scratch[id])
		{
			snprintf(buf, buflen,
					 "Leaf %u of tree %u is in the Leaf Table but not reachable from the inner nodes",
					 id, t->tree_no);
			return buf;
		}
	}
	if (cs.nodes != amr_counter_read(&t->ninner))
	{
		snprintf(buf, buflen, "Tree %u counts %llu inner nodes but %llu are reachable",
				 t->tree_no,
				 (unsigned long long) amr_counter_read(&t->ninner),
				 (unsigned long long) cs.nodes);
		return buf;
	}
	return NULL;
}
