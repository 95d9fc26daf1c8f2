// Tunable shader shapes: candidates, their names and limits, the defaults, and the table the
// backend chooses from (vulkan_tuning.h); the tuning file is vulkan_tuning_file.cpp's.
#include "backends/vulkan/vulkan_tuning.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "engine/core/errors.h"

namespace tmx::vk {
namespace {

constexpr const char* kNames[kKernelCount] = {"matmul",
                                              "matmul_gemv",
                                              "grouped_matmul",
                                              "grouped_matmul_gemv",
                                              "grouped_matmul_backward_dx",
                                              "grouped_matmul_backward_dw",
                                              "attention_tiled",
                                              "attention_split"};

constexpr uint32_t kVendorNvidia = 0x10DE;

// Tiled candidates {BM, BN, BK, TM, TN}; the workgroup is (BM/TM) * (BN/TN) invocations. From
// big register blocks (high arithmetic intensity, few workgroups) to skinny tiles for few rows.
constexpr std::array<std::array<uint32_t, 5>, 16> kTiles = {{
    {128, 128, 16, 8, 8},
    {128, 128, 16, 8, 16},
    {128, 64, 16, 8, 4},
    {64, 128, 16, 4, 8},
    {64, 64, 16, 4, 4},
    {64, 64, 16, 4, 8},
    {64, 64, 32, 4, 4},
    {64, 64, 8, 4, 4},
    {64, 32, 16, 4, 2},
    {32, 64, 16, 2, 4},
    {32, 64, 16, 4, 4},
    {32, 32, 16, 2, 2},
    {32, 32, 16, 4, 4},
    {16, 64, 16, 2, 4},
    {16, 64, 16, 1, 4},
    {16, 128, 16, 2, 8},
}};
// Cooperative-matrix candidates {BM, BN, BK, TM, TN} (".cm"; TM and TN give the workgroup, and
// the tile of the fp32 form calls without fp16 weights run): 16 x 16 blocks from 1 to 8 a
// subgroup at NVIDIA's 32 invocations, BK 32 (two blocks deep a slice) or 16.
constexpr std::array<std::array<uint32_t, 5>, 8> kCoopTiles = {{
    {64, 64, 32, 4, 4},
    {64, 64, 32, 4, 8},
    {128, 64, 32, 8, 4},
    {64, 128, 32, 4, 8},
    {128, 128, 32, 8, 8},
    {32, 64, 32, 2, 4},
    {32, 32, 32, 4, 4},
    {64, 64, 16, 4, 4},
}};
// matmul_tile_coopmat.glsl's arrays, in bytes: a's slice as two fp16 halves and b's, rows padded
// by 8 halves, and a 16 x CN fp32 block per subgroup.
uint64_t coop_tile_shared_bytes(uint64_t bm, uint64_t bn, uint64_t bk, uint64_t subgroups,
                                uint64_t cn) {
    return 2 * 2 * bm * (bk + 8) + 2 * bn * (bk + 8) + 4 * subgroups * 16 * cn;
}
// Matrix-vector candidates {WG, NR, SG}: WG a power of two (the shaders' reduction tree), NR
// output columns per workgroup, SG 1 to sum within subgroups first (vulkan_tuning.h).
constexpr uint32_t kGemvWg[] = {32, 64, 128, 256};
constexpr uint32_t kGemvRows[] = {1, 2, 4, 8};
constexpr uint32_t kGemvReductions[] = {0, 1};
constexpr uint32_t kGemvSlots = 4;  // rows of a (or slots) per workgroup: the shaders' MMAX, MS
// Attention candidates {WG, BQ, BK}: BQ queries per tile, keys staged BK at a time, WG / BQ
// invocations per query. The query tile and scores in shared memory (SG 0): the last four fit
// Vulkan's minimum of 16 KiB of shared memory.
constexpr std::array<std::array<uint32_t, 3>, 16> kAttentionTiles = {{
    {64, 16, 32},
    {64, 16, 16},
    {128, 16, 16},
    {128, 16, 32},
    {256, 16, 32},
    {64, 8, 32},
    {128, 8, 32},
    {32, 8, 32},
    {128, 32, 16},
    {256, 32, 16},
    {64, 8, 64},
    {128, 32, 32},
    {32, 8, 16},
    {64, 8, 16},
    {128, 8, 16},
    {32, 4, 16},
}};
// Attention candidates of SG 1 (a query's row in registers, vulkan_tuning.h), by invocations
// per query (WG / BQ): 4 and 2, then 8, then 16, which must divide the subgroup (lavapipe's of
// 4 runs the first nine). Fewer invocations per query spend fewer shuffles per score; more
// hold fewer of its channels each.
constexpr std::array<std::array<uint32_t, 3>, 16> kAttentionSubgroupTiles = {{
    {64, 16, 32},
    {64, 16, 64},
    {128, 32, 32},
    {128, 32, 16},
    {32, 8, 32},
    {256, 64, 32},
    {64, 32, 32},
    {128, 64, 32},
    {64, 16, 16},
    {64, 8, 32},
    {128, 16, 32},
    {256, 32, 32},
    {128, 16, 64},
    {32, 4, 32},
    {128, 8, 32},
    {256, 16, 32},
}};
// Blocked attention candidates {BQ, BK} (WG = BQ * BK / 16): from 32 invocations to 256, few
// queries a tile for short prompts (more workgroups), many for long ones.
constexpr std::array<std::array<uint32_t, 2>, 7> kAttentionBlockedTiles = {{
    {16, 32},
    {16, 64},
    {32, 32},
    {32, 64},
    {64, 32},
    {64, 64},
    {128, 32},
}};
// Decode attention candidates {WG, SL}: every pair of these. Short slices run more workgroups,
// each walking fewer keys with more invocations a key (a GPU's taste); long ones fewer, longer
// workgroups (a CPU driver's).
constexpr uint32_t kSplitWg[] = {32, 64, 128, 256};
constexpr uint32_t kSplitKeys[] = {16, 32, 64, 128};
// attention_split.comp's arrays, in floats: the group's queries (MAX_GROUP_DIM), the chunk's
// keys (MAX_CHUNK_DIM), per head its scores and statistics (MAX_GROUP rows of SL + 2), and each
// invocation's part of each head's dot product (MAX_GROUP * WG).
uint64_t split_shared_floats(uint64_t wg, uint64_t sl) {
    return uint64_t{kSplitGroupDim} + kSplitChunkDim + kSplitMaxGroup * (sl + 2) +
           kSplitMaxGroup * wg;
}
// attention_split_rows.comp's (".v4"), for a group of 16: the queries and the chunk's keys as
// above, the scores, the trees' rows (or the value pass's parts of 4 * WG), the statistics.
uint64_t split_rows_shared_floats(uint64_t wg, uint64_t sl) {
    return uint64_t{kSplitGroupDim} + kSplitChunkDim + kSplitMaxGroup * sl +
           std::max(kSplitMaxGroup * sl, 4 * wg) + 2 * kSplitMaxGroup;
}

// attention_tiled.comp's subgroup form: the key tile, and the value tile beside it or in its
// place, up to MAX_HEAD_DIM floats a row.
uint64_t attention_subgroup_shared_floats(uint64_t bk, bool separate_values) {
    return (separate_values ? 2 : 1) * bk * kAttentionTiledMaxHeadDim;
}

// matmul_tile.glsl's arrays for one operand's slice (`side` rows or columns, BK deep, T of them
// an invocation's): runs of 4 (T a multiple of 4) in vec4s at a pitch of side + 4, else floats at
// side + 1; the form not taken still declares one element.
uint64_t tile_shared_floats(uint64_t side, uint64_t bk, uint64_t t) {
    return t % 4 == 0 ? bk * (side + 4) + 1 : bk * (side + 1) + 4;
}

// attention_tiled.comp's blocked form (".rb4"), its tiles sized for head_dim hd: the query and
// key tiles 16 channels deep, the value tile 16 keys deep, the scores, and the statistics.
uint64_t blocked_attention_shared_floats(uint64_t bq, uint64_t bk, uint64_t hd) {
    return 16 * (bq + 4) + 16 * (bk + 4) + 16 * (hd + 4) + bk * (bq + 4) + bk * bq / 4 + 3 * bq;
}

enum class Form { Tiled, Gemv, Attention, Split };
Form form_of(Kernel k) {
    return k == Kernel::AttentionTiled   ? Form::Attention
           : k == Kernel::AttentionSplit ? Form::Split
           : is_gemv(k)                  ? Form::Gemv
                                         : Form::Tiled;
}

Variant tile(uint32_t bm, uint32_t bn, uint32_t bk, uint32_t tm, uint32_t tn, uint32_t form = 0) {
    return {{(bm / tm) * (bn / tn), bm, bn, bk, tm, tn, form}};
}

bool has_coop_form(Kernel k) {
    return k == Kernel::Matmul || k == Kernel::GroupedMatmul;
}

bool parse_uint(std::string_view s, uint32_t& out) {
    if (s.empty() || s.size() > 5) return false;  // every real size is far below 100,000
    uint32_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint32_t>(c - '0');
    }
    out = v;
    return true;
}

}  // namespace

const char* kernel_name(Kernel k) {
    return kNames[static_cast<int>(k)];
}

std::optional<Kernel> kernel_from_name(std::string_view name) {
    for (int i = 0; i < kKernelCount; ++i)
        if (name == kNames[i]) return static_cast<Kernel>(i);
    return std::nullopt;
}

bool is_gemv(Kernel k) {
    return k == Kernel::MatmulGemv || k == Kernel::GroupedMatmulGemv;
}

std::string Variant::name(Kernel k) const {
    if (form_of(k) == Form::Split)
        return spec.size() == 3 ? "wg" + std::to_string(spec[0]) + ".sl" + std::to_string(spec[1]) +
                                      (spec[2] == kSplitRows ? ".v4" : "")
                                : "?";
    if (form_of(k) == Form::Attention)
        return spec.size() == 4 ? "wg" + std::to_string(spec[0]) + ".bq" + std::to_string(spec[1]) +
                                      ".bk" + std::to_string(spec[2]) +
                                      (spec[3] == kAttentionBlocked ? ".rb4"
                                       : spec[3] ? ".sg" + std::to_string(spec[3])
                                                 : "")
                                : "?";
    if (is_gemv(k))
        return spec.size() == 3 ? "wg" + std::to_string(spec[0]) + ".nr" + std::to_string(spec[1]) +
                                      (spec[2] ? ".sg" + std::to_string(spec[2]) : "")
                                : "?";
    if (spec.size() != 7) return "?";
    return "bm" + std::to_string(spec[1]) + ".bn" + std::to_string(spec[2]) + ".bk" +
           std::to_string(spec[3]) + ".tm" + std::to_string(spec[4]) + ".tn" +
           std::to_string(spec[5]) + (spec[6] == kTiledCoopmat ? ".cm" : "");
}

Variant runnable_form(Kernel k, const Variant& v, const DeviceInfo& d) {
    if (form_of(k) != Form::Tiled || v.spec.size() != 7 || v.spec[6] != kTiledCoopmat ||
        d.coopmat_columns != 0)
        return v;
    Variant fp32 = v;
    fp32.spec[6] = 0;
    return fp32;
}

std::vector<uint32_t> tiled_spec(const Variant& v, const DeviceInfo& d, bool coop) {
    std::vector<uint32_t> spec(v.spec.begin(), v.spec.begin() + 6);
    if (coop) spec.insert(spec.end(), {d.subgroup_size, d.coopmat_columns});
    return spec;
}

std::optional<Variant> parse_variant(Kernel k, std::string_view name) {
    const Form form = form_of(k);
    const std::vector<std::string> fields =
        form == Form::Gemv        ? std::vector<std::string>{"wg", "nr"}
        : form == Form::Attention ? std::vector<std::string>{"wg", "bq", "bk"}
        : form == Form::Split     ? std::vector<std::string>{"wg", "sl"}
                                  : std::vector<std::string>{"bm", "bn", "bk", "tm", "tn"};
    // A matrix-vector or prefill attention name may end in ".sg1", a prefill attention name in
    // ".rb4" (vulkan_tuning.h); without either SG is 0.
    // A decode attention name may end in ".v4" (kSplitRows), else its form is 0.
    const bool has_sg = form == Form::Gemv || form == Form::Attention || form == Form::Split;
    uint32_t sg = 0;
    if ((form == Form::Gemv || form == Form::Attention) && name.size() > 4 &&
        name.substr(name.size() - 4) == ".sg1") {
        name.remove_suffix(4);
        sg = 1;
    } else if (form == Form::Attention && name.size() > 4 &&
               name.substr(name.size() - 4) == ".rb4") {
        name.remove_suffix(4);
        sg = kAttentionBlocked;
    } else if (form == Form::Split && name.size() > 3 && name.substr(name.size() - 3) == ".v4") {
        name.remove_suffix(3);
        sg = kSplitRows;
    } else if (form == Form::Tiled && name.size() > 3 && name.substr(name.size() - 3) == ".cm") {
        name.remove_suffix(3);
        sg = kTiledCoopmat;
    }
    std::vector<uint32_t> values;
    size_t at = 0;
    for (size_t i = 0; i < fields.size(); ++i) {
        if (name.substr(at, 2) != fields[i]) return std::nullopt;
        at += 2;
        const size_t end = i + 1 < fields.size() ? name.find('.', at) : name.size();
        if (end == std::string_view::npos) return std::nullopt;
        uint32_t v = 0;
        if (!parse_uint(name.substr(at, end - at), v) || v == 0) return std::nullopt;
        values.push_back(v);
        at = end + 1;
    }
    if (has_sg) values.push_back(sg);
    if (form != Form::Tiled) return Variant{values};
    const uint32_t bm = values[0], bn = values[1], tm = values[3], tn = values[4];
    if (bm % tm != 0 || bn % tn != 0) return std::nullopt;
    return tile(bm, bn, values[2], tm, tn, sg);
}

// Why a variant that sums through subgroup shuffles cannot run on the device (empty: it can):
// it needs shuffles in compute shaders and subgroups of a power of two.
static std::string subgroup_refusal(const DeviceInfo& d) {
    if (!d.subgroup_shuffle)
        return "it sums through subgroup shuffles, which the device does not report for compute "
               "shaders";
    if (!std::has_single_bit(d.subgroup_size))
        return "it sums through subgroups, and the device reports subgroups of " +
               std::to_string(d.subgroup_size) + " invocations, not a power of two";
    return "";
}

std::string invalid_reason(Kernel k, const Variant& v, const DeviceInfo& d) {
    const uint32_t wg = v.spec.empty() ? 0 : v.spec[0];
    uint64_t shared_floats = 0;
    if (form_of(k) == Form::Split) {
        if (v.spec.size() != 3 || v.spec[2] > kSplitRows) return "not a decode attention variant";
        if (v.spec[1] == 0 || v.spec[1] > 256) return "its slices are not of 1 to 256 keys";
        // One invocation per head of a group sums its scores (a group holds up to 16 heads).
        if (wg < kSplitMaxGroup)
            return "its workgroup is smaller than a group's " + std::to_string(kSplitMaxGroup) +
                   " heads";
        if (v.spec[2] == kSplitRows && !std::has_single_bit(v.spec[1]))
            return "its slices' trees need a power of two keys";
        shared_floats = v.spec[2] == kSplitRows ? split_rows_shared_floats(wg, v.spec[1])
                                                : split_shared_floats(wg, v.spec[1]);
    } else if (form_of(k) == Form::Attention) {
        if (v.spec.size() != 4 || v.spec[3] > kAttentionBlocked) return "not an attention variant";
        const uint64_t bq = v.spec[1], bk = v.spec[2];
        if (bq == 0 || bk == 0 || wg % bq != 0)
            return "its workgroup is not a multiple of its queries per tile";
        const uint64_t lanes = wg / bq;
        if (v.spec[3] == kAttentionBlocked) {
            // A 4 x 4 block of scores an invocation; whole runs of 4 output channels each at
            // every head_dim the tiles are sized for (32, 64, 128: at least BK).
            if (bq % 4 != 0 || (bk != 32 && bk != 64) || wg != bq * bk / 16)
                return "its tile is not 4 x 4 blocks of a workgroup (BK 32 or 64, WG = BQ * BK "
                       "/ 16)";
            shared_floats = blocked_attention_shared_floats(bq, bk, kAttentionTiledMaxHeadDim);
        } else if (v.spec[3] == 1) {
            if (std::string why = subgroup_refusal(d); !why.empty()) return why;
            // A query's invocations must be consecutive in one subgroup, and its butterfly
            // pairs them by xor: a power of two dividing the subgroup, in whole subgroups.
            // (The shader, SPIR-V 1.5, runs at the subgroup size the device reports.)
            if (!std::has_single_bit(lanes) || lanes > d.subgroup_size)
                return "its " + std::to_string(lanes) +
                       " invocations per query do not divide a subgroup (" +
                       std::to_string(d.subgroup_size) + ")";
            if (wg % d.subgroup_size != 0)
                return "its workgroup (" + std::to_string(wg) + ") is not whole subgroups (" +
                       std::to_string(d.subgroup_size) + ")";
            shared_floats = attention_subgroup_shared_floats(bk, false);
        } else {
            // attention_tiled.comp's arrays: query and key rows padded to MAX_HEAD_DIM + 1,
            // score and weight rows to BK + LANES.
            shared_floats = (bq + bk) * (kAttentionTiledMaxHeadDim + 1) + 2 * bq * (bk + lanes);
        }
    } else if (is_gemv(k)) {
        if (v.spec.size() != 3 || v.spec[2] > 1) return "not a matrix-vector variant";
        if (!std::has_single_bit(wg)) return "its workgroup is not a power of two";
        if (v.spec[2] == 1) {
            if (std::string why = subgroup_refusal(d); !why.empty()) return why;
            // gemv_reduce.glsl takes any subgroup size (tested at lavapipe's 4, 8 and 16) as
            // long as whole subgroups fill the workgroup: a power of two no larger than it.
            if (wg < d.subgroup_size)
                return "its workgroup (" + std::to_string(wg) + ") is smaller than a subgroup (" +
                       std::to_string(d.subgroup_size) + ")";
        }
        shared_floats = uint64_t{kGemvSlots} * v.spec[1] * wg;
    } else {
        if (v.spec.size() != 7 || v.spec[6] > kTiledCoopmat) return "not a tiled variant";
        // 64-bit products: a variant read from a file may hold any 32-bit values.
        const uint64_t bm = v.spec[1], bn = v.spec[2], bk = v.spec[3], tm = v.spec[4],
                       tn = v.spec[5];
        if (tm == 0 || tn == 0 || bm % tm != 0 || bn % tn != 0 || wg != (bm / tm) * (bn / tn))
            return "its workgroup does not match its tile and register block";
        if (tm * tn > 128) return "its register block is over 128 accumulators";
        shared_floats = tile_shared_floats(bm, bk, tm) + tile_shared_floats(bn, bk, tn);
        if (v.spec[6] == kTiledCoopmat) {
            if (!has_coop_form(k))
                return "only matmul and grouped_matmul have a cooperative-matrix form";
            const uint64_t cn = d.coopmat_columns, sgs = d.subgroup_size;
            if (cn == 0)
                return "it runs on cooperative matrices, and the device has no usable "
                       "VK_NV_cooperative_matrix (16 x 16 x 16 or 16 x 8 x 16 fp16, fp32 "
                       "accumulators)";
            if (sgs == 0 || wg % sgs != 0)
                return "its workgroup (" + std::to_string(wg) + ") is not whole subgroups (" +
                       std::to_string(sgs) + ")";
            if (bm % 16 != 0 || bk % 16 != 0 || bn % cn != 0)
                return "its tile is not whole 16 x " + std::to_string(cn) + " blocks, 16 deep";
            if ((bm / 16) * (bn / cn) % (wg / sgs) != 0)
                return "its " + std::to_string((bm / 16) * (bn / cn)) +
                       " blocks do not divide among its " + std::to_string(wg / sgs) + " subgroups";
            // Bytes, as floats (rounded up) for the check below.
            shared_floats = (coop_tile_shared_bytes(bm, bn, bk, wg / sgs, cn) + 3) / 4;
        }
    }
    if (wg == 0 || wg > d.max_workgroup_invocations || wg > d.max_workgroup_size_x)
        return "its workgroup of " + std::to_string(wg) + " invocations is over the device's " +
               std::to_string(std::min(d.max_workgroup_invocations, d.max_workgroup_size_x));
    if (shared_floats * 4 > d.shared_memory_bytes)
        return "it needs " + std::to_string(shared_floats * 4) +
               " bytes of shared memory, the device has " + std::to_string(d.shared_memory_bytes);
    return "";
}

uint32_t blocked_attention_head_dim(const Variant& v, int64_t hd) {
    uint32_t sized = std::max<uint32_t>(32, v.spec[2]);
    while (sized < hd && sized < kAttentionTiledMaxHeadDim) sized *= 2;
    return sized;
}

std::vector<Variant> candidates(Kernel k, const DeviceInfo& d) {
    std::vector<Variant> all;
    if (form_of(k) == Form::Split) {
        for (uint32_t form : {0u, kSplitRows})
            for (uint32_t sl : kSplitKeys)
                for (uint32_t wg : kSplitWg) all.push_back({{wg, sl, form}});
    } else if (form_of(k) == Form::Attention) {
        for (const auto& t : kAttentionTiles) all.push_back({{t[0], t[1], t[2], 0}});
        for (const auto& t : kAttentionSubgroupTiles) all.push_back({{t[0], t[1], t[2], 1}});
        for (const auto& t : kAttentionBlockedTiles)
            all.push_back({{t[0] * t[1] / 16, t[0], t[1], kAttentionBlocked}});
    } else if (is_gemv(k)) {
        for (uint32_t sg : kGemvReductions)
            for (uint32_t wg : kGemvWg)
                for (uint32_t nr : kGemvRows) all.push_back({{wg, nr, sg}});
    } else {
        for (const auto& t : kTiles) all.push_back(tile(t[0], t[1], t[2], t[3], t[4]));
        if (has_coop_form(k))
            for (const auto& t : kCoopTiles)
                all.push_back(tile(t[0], t[1], t[2], t[3], t[4], kTiledCoopmat));
    }
    std::erase_if(all, [&](const Variant& v) { return !invalid_reason(k, v, d).empty(); });
    return all;
}

bool attention_separate_values(const Variant& v, const DeviceInfo& d) {
    return attention_subgroup_shared_floats(v.spec[2], true) * 4 <= d.shared_memory_bytes;
}

std::string ShapeKey::to_string() const {
    if (kernel == Kernel::AttentionSplit)
        return std::string(kernel_name(kernel)) + " rows<=" + std::to_string(rows_class) +
               " head_dim=" + std::to_string(n) + " keys=" + std::to_string(k) +
               " heads=" + std::to_string(layout);
    if (kernel == Kernel::AttentionTiled)
        return std::string(kernel_name(kernel)) + " rows<=" + std::to_string(rows_class) +
               " head_dim=" + std::to_string(n) + " window=" + std::to_string(k) +
               " heads=" + std::to_string(layout);
    std::string s = std::string(kernel_name(kernel)) + " rows<=" + std::to_string(rows_class) +
                    " n=" + std::to_string(n) + " k=" + std::to_string(k);
    if (kernel == Kernel::Matmul || kernel == Kernel::MatmulGemv) {
        if (layout & 1) s += " a^T";
        if (layout & 2) s += " b^T";
    } else {
        s += " experts=" + std::to_string(layout);
    }
    return s;
}

ShapeKey shape_key(Kernel kernel, int64_t rows, int64_t n, int64_t k, uint32_t layout) {
    const auto clamp32 = [](int64_t v) {
        return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, int64_t{1} << 30));
    };
    return {kernel, std::bit_ceil(std::max<uint32_t>(1, clamp32(rows))), clamp32(n), clamp32(k),
            layout};
}

// ---- the table

TuningTable::TuningTable(const DeviceInfo& d) : device_(&d) {
    // Every device has 128 invocations and 16 KiB of shared memory per workgroup; most have
    // more, which the 256-invocation tiles assume.
    const bool wide = d.max_workgroup_invocations >= 256 && d.max_workgroup_size_x >= 256;
    large_ = wide ? tile(128, 128, 16, 8, 8) : tile(128, 128, 16, 8, 16);
    small_ = wide ? tile(64, 64, 16, 4, 4) : tile(64, 64, 16, 4, 8);
    skinny_ = tile(16, 64, 16, 2, 4);
    gemv_ = {{64, 4, 0}};
    // Register-blocked, 32 queries x 32 keys (on lavapipe 8x faster than the shared-memory
    // form's 16 x 32, docs/performance.md); on a device with less shared memory than it needs,
    // the shared-memory form, and below that the tile that fits Vulkan's minimum.
    for (const Variant& v : {Variant{{64, 32, 32, kAttentionBlocked}}, Variant{{64, 16, 32, 0}},
                             Variant{{32, 8, 16, 0}}}) {
        attention_ = v;
        if (invalid_reason(Kernel::AttentionTiled, v, d).empty()) break;
    }
    grouped_gemv_ = gemv_;
    // 64 keys a slice, one invocation a key; on a device with less shared memory than that
    // needs, the smallest variant (none fits below about 16 KiB: attention takes another path).
    // Decode attention in the short-chain form (".v4"): at the same slices, 1.4x (batch 1) and
    // 1.8x (batch 4) faster than the first form on lavapipe (the demo model's shapes, tmx tune
    // on 2026-11-29); unmeasured on a GPU, where the first form's 64-read chains cost most.
    split_ = {{64, 64, kSplitRows}};
    if (!invalid_reason(Kernel::AttentionSplit, split_, d).empty()) split_ = {{32, 16, kSplitRows}};
    if (d.vendor_id == kVendorNvidia) {
        // On NVIDIA the 8x8 register block of the 128x128 tile is 2-11x slower than the 64x64
        // tile's 4x4 on most products (H100, docs/gpu-results.md, 2026-11-23; H200 tune,
        // 2026-11-28: 10x on the 4096x512x512 one, though faster on the largest grouped ones).
        large_ = small_;
        // An H200's tune of both models (2026-11-28, docs/gpu-results.md): the variants nearest
        // every shape's best (geometric mean of time over best): attention 256 invocations,
        // 16 queries, 32 keys (1.06x the best, the old default 3.2x); matrix-vector 128 per
        // workgroup, a column each (1.21x; 64x4 1.54x); the grouped ones 64, two columns each
        // (1.30x; 64x4 1.44x).
        const Variant attention{{256, 16, 32, 0}}, gemv{{128, 1, 0}}, grouped_gemv{{64, 2, 0}};
        if (invalid_reason(Kernel::AttentionTiled, attention, d).empty()) attention_ = attention;
        if (invalid_reason(Kernel::MatmulGemv, gemv, d).empty()) gemv_ = gemv;
        if (invalid_reason(Kernel::GroupedMatmulGemv, grouped_gemv, d).empty())
            grouped_gemv_ = grouped_gemv;
    }
    if (!invalid_reason(Kernel::Matmul, large_, d).empty()) large_ = small_;
}

Variant TuningTable::default_variant(Kernel kernel, int64_t rows, int64_t n, int64_t k,
                                     uint32_t layout) const {
    switch (kernel) {
        case Kernel::MatmulGemv:
            return gemv_;
        case Kernel::GroupedMatmulGemv:
            return grouped_gemv_;
        case Kernel::Matmul:
            // Large tiles only when there are enough of them to occupy a big GPU.
            return rows >= 256 && n >= 256 ? large_ : rows <= skinny_max_rows_ ? skinny_ : small_;
        case Kernel::GroupedMatmul:
        case Kernel::GroupedMatmulDx:
            // Expert slabs are short (each is cut into its own tiles): small tiles waste less.
            return rows <= int64_t{layout} * skinny_max_rows_ ? skinny_ : small_;
        case Kernel::GroupedMatmulDw:  // rows: the slots summed over; n x k: w's shape
            return n >= 256 && k >= 256 ? large_ : small_;
        case Kernel::AttentionTiled:
            return attention_;
        case Kernel::AttentionSplit:
            return split_;
    }
    return small_;
}

Variant TuningTable::choose(Kernel kernel, int64_t rows, int64_t n, int64_t k,
                            uint32_t layout) const {
    if (const auto& f = forced_[static_cast<int>(kernel)]) return *f;
    if (!tuned_.empty()) {
        const ShapeKey key = shape_key(kernel, rows, n, k, layout);
        if (auto it = tuned_.find(key); it != tuned_.end()) return it->second;
        // The nearest rows class of the same kernel, columns, depth and layout.
        const Variant* best = nullptr;
        uint32_t best_distance = UINT32_MAX;
        for (auto it = tuned_.lower_bound({kernel, 0, 0, 0, 0});
             it != tuned_.end() && it->first.kernel == kernel; ++it) {
            const ShapeKey& t = it->first;
            if (t.n != key.n || t.k != key.k || t.layout != key.layout) continue;
            const uint32_t d = static_cast<uint32_t>(
                std::abs(std::countr_zero(t.rows_class) - std::countr_zero(key.rows_class)));
            if (d < best_distance) best_distance = d, best = &it->second;
        }
        if (best) return *best;
    }
    return default_variant(kernel, rows, n, k, layout);
}

void TuningTable::force(Kernel kernel, std::optional<Variant> v) {
    if (v) {
        if (std::string why = invalid_reason(kernel, *v, *device_); !why.empty())
            throw Error(std::string("Vulkan: variant ") + v->name(kernel) + " of " +
                        kernel_name(kernel) + " cannot run on this device: " + why);
    }
    forced_[static_cast<int>(kernel)] = std::move(v);
}

void TuningTable::force_from_list(std::string_view list) {
    size_t at = 0;
    while (at <= list.size()) {
        size_t end = list.find(',', at);
        if (end == std::string_view::npos) end = list.size();
        const std::string_view part = list.substr(at, end - at);
        at = end + 1;
        if (part.empty()) continue;
        const size_t eq = part.find('=');
        const std::optional<Kernel> k =
            eq == std::string_view::npos ? std::nullopt : kernel_from_name(part.substr(0, eq));
        if (!k)
            throw Error("TMX_VULKAN_FORCE_VARIANT: '" + std::string(part) +
                        "': expected KERNEL=VARIANT with KERNEL one of matmul, matmul_gemv, "
                        "grouped_matmul, grouped_matmul_gemv, grouped_matmul_backward_dx, "
                        "grouped_matmul_backward_dw, attention_tiled");
        const std::optional<Variant> v = parse_variant(*k, part.substr(eq + 1));
        if (!v)
            throw Error("TMX_VULKAN_FORCE_VARIANT: '" + std::string(part.substr(eq + 1)) +
                        "' is not a variant of " + kernel_name(*k) + " (e.g. " +
                        candidates(*k, *device_).front().name(*k) + ")");
        force(*k, v);
    }
}

void TuningTable::set_tuned(const TuningFile& f, const std::string& path) {
    tuned_.clear();
    for (const TunedShape& s : f.shapes)
        tuned_[s.key] = runnable_form(s.key.kernel, s.best, *device_);
    tuned_from_ = path;
}

}  // namespace tmx::vk
