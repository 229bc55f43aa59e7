/*-------------------------------------------------------------------------
 *
 * boost_rtree.cpp
 *		The same workload as amr_core_bench.c on Boost.Geometry's R-tree.
 *
 * Reads the same data file (first --rows rows, parsed with strtod() so the
 * coordinates are bit-identical), inserts the boxes one by one into a
 * boost::geometry::index::rtree (rstar<16> and/or quadratic<16>), and runs
 * the windows that amr_core_bench wrote to <dir>/windows-<sel>.txt, whose
 * fifth column is amrtree's result count: every count must agree.
 *
 * amrtree implements PostgreSQL's box && box, which is fuzzy: a && b holds
 * when a.xlo <= b.xhi + EPSILON and b.xlo <= a.xhi + EPSILON (and likewise
 * for y), EPSILON = 1e-6.  Boost's intersects() is exact, so each window is
 * widened by EPSILON on every side before querying.  (A key coordinate
 * within one rounding step of a widened edge could in principle be judged
 * differently; the comparison would then report it.)
 *
 * Machine-readable results are printed on lines starting with '@'.
 *
 *-------------------------------------------------------------------------
 */
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <boost/geometry.hpp>
#include <boost/geometry/index/rtree.hpp>
#include <boost/iterator/function_output_iterator.hpp>

namespace bg = boost::geometry;
namespace bgi = boost::geometry::index;

typedef bg::model::point<double, 2, bg::cs::cartesian> Point;
typedef bg::model::box<Point> Box;
typedef std::pair<Box, uint32_t> Value;

/* Same value as AMR_EPSILON (PostgreSQL's EPSILON) */
static const double kEpsilon = 1.0E-06;

static const char *const sel_label[] = {"0.001", "0.01", "0.1", "1"};

struct Window
{
	Box			query;			/* already widened by kEpsilon */
	uint64_t	expect;			/* amrtree's count */
};

static double
now_ms()
{
	return std::chrono::duration<double, std::milli>(
		std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::vector<Value>
read_boxes(const char *path, size_t maxrows)
{
	std::vector<Value> out;
	FILE	   *f = std::fopen(path, "r");
	char		line[512];

	if (f == nullptr)
	{
		std::perror(path);
		std::exit(2);
	}
	out.reserve(maxrows);
	while (out.size() < maxrows && std::fgets(line, sizeof(line), f) != nullptr)
	{
		char	   *p = line,
				   *end;
		double		v[6];
		int			i;

		for (i = 0; i < 6; i++)
		{
			v[i] = std::strtod(p, &end);
			if (end == p)
				break;
			p = end;
		}
		if (i < 6)
		{
			std::fprintf(stderr, "%s:%zu: bad line\n", path, out.size() + 1);
			std::exit(2);
		}
		out.emplace_back(Box(Point(v[0], v[1]), Point(v[3], v[4])),
						 static_cast<uint32_t>(out.size()));
	}
	std::fclose(f);
	return out;
}

static std::vector<Window>
read_windows(const std::string &path)
{
	std::vector<Window> out;
	FILE	   *f = std::fopen(path.c_str(), "r");
	char		line[512];

	if (f == nullptr)
	{
		std::perror(path.c_str());
		std::exit(2);
	}
	while (std::fgets(line, sizeof(line), f) != nullptr)
	{
		char	   *p = line,
				   *end;
		double		v[4];
		Window		w;

		for (int i = 0; i < 4; i++)
		{
			v[i] = std::strtod(p, &end);
			if (end == p)
			{
				std::fprintf(stderr, "%s: bad line\n", path.c_str());
				std::exit(2);
			}
			p = end;
		}
		w.expect = std::strtoull(p, nullptr, 10);
		w.query = Box(Point(v[0] - kEpsilon, v[1] - kEpsilon),
					  Point(v[2] + kEpsilon, v[3] + kEpsilon));
		out.push_back(w);
	}
	std::fclose(f);
	return out;
}

template <typename Params>
static int
run(const char *name, const std::vector<Value> &data,
	const std::vector<std::vector<Window>> &windows)
{
	bgi::rtree<Value, Params> tree;
	int			mismatches_total = 0;
	double		start = now_ms(),
				ms;

	for (const Value &v : data)
		tree.insert(v);
	ms = now_ms() - start;
	std::printf("@insert algo=%s n=%zu ms=%.1f per_ms=%.1f\n",
				name, data.size(), ms, data.size() / ms);
	std::fflush(stdout);

	for (size_t s = 0; s < windows.size(); s++)
	{
		const std::vector<Window> &ws = windows[s];
		uint64_t	count = 0;
		auto		counter = boost::make_function_output_iterator(
			[&count] (const Value &) { count++; });
		uint64_t	total = 0,
					total2 = 0;
		int			mismatches = 0;

		/* warm-up pass, which also compares every count with amrtree's */
		for (size_t q = 0; q < ws.size(); q++)
		{
			count = 0;
			tree.query(bgi::intersects(ws[q].query), counter);
			if (count != ws[q].expect)
			{
				if (mismatches < 5)
					std::fprintf(stderr,
								 "MISMATCH %s sel %s%% window %zu: boost %llu, amrtree %llu\n",
								 name, sel_label[s], q, (unsigned long long) count,
								 (unsigned long long) ws[q].expect);
				mismatches++;
			}
			total += count;
		}
		count = 0;
		start = now_ms();
		for (size_t q = 0; q < ws.size(); q++)
			tree.query(bgi::intersects(ws[q].query), counter);
		ms = now_ms() - start;
		total2 = count;
		if (total2 != total)
		{
			std::fprintf(stderr, "repeated queries differ: %llu vs %llu\n",
						 (unsigned long long) total, (unsigned long long) total2);
			mismatches++;
		}
		std::printf("@query algo=%s sel=%s windows=%zu mean_us=%.3f mean_results=%.1f mismatches=%d\n",
					name, sel_label[s], ws.size(), ms * 1000.0 / ws.size(),
					(double) total / ws.size(), mismatches);
		std::fflush(stdout);
		mismatches_total += mismatches;
	}
	return mismatches_total;
}

static void
usage()
{
	std::fprintf(stderr,
				 "usage: boost_rtree --data FILE --windows-dir DIR [--rows N]\n"
				 "                   [--algo rstar|quadratic|both]\n");
	std::exit(2);
}

int
main(int argc, char **argv)
{
	const char *data_path = nullptr;
	std::string dir = ".";
	size_t		rows = 1000000;
	std::string algo = "both";
	int			mismatches = 0;

	for (int i = 1; i < argc; i += 2)
	{
		if (i + 1 >= argc)
			usage();
		if (std::strcmp(argv[i], "--data") == 0)
			data_path = argv[i + 1];
		else if (std::strcmp(argv[i], "--windows-dir") == 0)
			dir = argv[i + 1];
		else if (std::strcmp(argv[i], "--rows") == 0)
			rows = std::strtoull(argv[i + 1], nullptr, 10);
		else if (std::strcmp(argv[i], "--algo") == 0)
			algo = argv[i + 1];
		else
			usage();
	}
	if (data_path == nullptr ||
		(algo != "rstar" && algo != "quadratic" && algo != "both"))
		usage();

	std::vector<Value> data = read_boxes(data_path, rows);
	std::vector<std::vector<Window>> windows;

	for (const char *label : sel_label)
		windows.push_back(read_windows(dir + "/windows-" + label + ".txt"));
	std::printf("boost_rtree: Boost %d.%d.%d, %zu rows, windows from %s\n",
				BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000,
				BOOST_VERSION % 100, data.size(), dir.c_str());

	if (algo == "rstar" || algo == "both")
		mismatches += run<bgi::rstar<16>>("rstar16", data, windows);
	if (algo == "quadratic" || algo == "both")
		mismatches += run<bgi::quadratic<16>>("quadratic16", data, windows);

	if (mismatches != 0)
	{
		std::fprintf(stderr,
					 "\n*** MISMATCH: %d Boost window counts differ from amrtree's ***\n\n",
					 mismatches);
		return 1;
	}
	std::printf("all Boost counts equal amrtree's\n");
	return 0;
}
