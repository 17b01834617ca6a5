#include "formats/fsdp/unit_cut.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <numeric>

namespace ckptfs::formats::fsdp {

namespace {

// The unit holding `name`: the one of the longest module that is a prefix of it (the root unit, module "",
// holds what no nested unit does); null when none does.
const FlatUnit* owner(const std::vector<FlatUnit>& units, const std::string& name) {
  const FlatUnit* best = nullptr;
  for (const auto& u : units)
    if ((u.module.empty() || name.starts_with(u.module + ".")) &&
        (best == nullptr || u.module.size() > best->module.size()))
      best = &u;
  return best;
}

// Whether every original parameter's piece lies inside that parameter in `cut` (a tied alias's piece is
// its target's).
bool pieces_fit(const CutUnit& cut, const std::string& prefix,
                const std::map<std::string, std::string>& aliases) {
  std::map<std::string, std::pair<int64_t, int64_t>, std::less<>> range;  // saved name -> [first, end)
  for (const auto& p : cut.parameters) range[prefix + p.name] = {p.first, p.first + shape_numel(p.shape)};
  for (const auto& [alias, target] : aliases)
    if (range.contains(prefix + target)) range[prefix + alias] = range[prefix + target];
  return std::all_of(cut.unit->pieces.begin(), cut.unit->pieces.end(), [&](const OrigPiece& piece) {
    const auto it = range.find(piece.name);
    return it != range.end() && it->second.first <= piece.first &&
           piece.first + piece.count <= it->second.second;
  });
}

// FSDP pads before each parameter to a multiple of `alignment` and at the end to divide by the world size,
// both with use_orig_params only (then the pieces pin the alignment down: with more than 4 ranks a wrong one
// can still end within the world-size padding).
std::optional<CutUnit> cut_with(const FlatUnit& unit, const std::vector<const HfParameter*>& params,
                                int64_t alignment, int64_t world_size, const std::string& prefix,
                                const std::map<std::string, std::string>& aliases) {
  CutUnit out{&unit, alignment, 0, {}};
  int64_t at = 0;
  for (const auto* p : params) {
    const int64_t pad = (alignment - at % alignment) % alignment;
    at += pad;
    out.padding += pad;
    out.parameters.push_back({p->name, p->shape, at});
    at += shape_numel(p->shape);
  }
  const int64_t tail = unit.numel - at;
  const bool aligned = !unit.pieces.empty();
  if (!(tail == 0 || (aligned && tail > 0 && tail < world_size && unit.numel % world_size == 0)))
    return std::nullopt;
  if (aligned ? !pieces_fit(out, prefix, aliases) : alignment != 1) return std::nullopt;
  out.padding += tail;
  return out;
}

// 16 bytes of an 8-, 4-, 2- or 1-byte compute dtype: the alignments use_orig_params pads to.
constexpr std::array<int64_t, 4> kAlignments = {1, 2, 4, 8};

}  // namespace

std::variant<std::vector<CutUnit>, std::string> cut_units(const std::vector<FlatUnit>& units,
                                                          const std::vector<HfParameter>& parameters,
                                                          const std::string& prefix, int64_t world_size,
                                                          const std::string& source) {
  std::map<const FlatUnit*, std::vector<const HfParameter*>> owned;
  std::map<std::string, std::string> aliases;  // tied name -> its target
  for (const auto& p : parameters) {
    if (!p.tied_to.empty()) {  // flattened once, as its target
      aliases[p.name] = p.tied_to;
      continue;
    }
    const FlatUnit* u = owner(units, prefix + p.name);
    if (u == nullptr)
      return fmt::format("{} belongs to no FSDP unit (units: {} ...)", prefix + p.name, units[0].key);
    owned[u].push_back(&p);
  }
  std::vector<CutUnit> out;
  for (const auto& unit : units) {
    const auto& params = owned[&unit];
    if (params.empty()) return fmt::format("{}: no parameter of {} falls in this unit", unit.key, source);
    std::optional<CutUnit> cut;
    for (const int64_t a : kAlignments)
      if ((cut = cut_with(unit, params, a, world_size, prefix, aliases))) break;
    if (!cut) {
      int64_t total = 0;
      for (const auto* p : params) total += shape_numel(p->shape);
      return fmt::format(
          "{}: its {} parameters per {} ({} ... {}) hold {} elements, its flat parameter has {}, and "
          "no FSDP padding (alignment to {} elements, world-size padding) places them {}",
          unit.key, params.size(), source, params.front()->name, params.back()->name, total, unit.numel,
          fmt::join(kAlignments, ", "),
          unit.pieces.empty() ? "exactly" : "where the ranks' pieces of them lie");
    }
    out.push_back(std::move(*cut));
  }
  return out;
}

std::shared_ptr<catalog::Catalog> cut_model(const std::vector<CutUnit>& cut,
                                            const std::vector<HfParameter>& parameters,
                                            const std::string& prefix) {
  std::map<std::string, catalog::LogicalTensor> by_name;
  for (const auto& u : cut)
    for (const auto& p : u.parameters)
      by_name.emplace(p.name, flat_slice(*u.unit, p.name, p.shape, p.first,
                                         fmt::format("{} elements [{}, {})", u.unit->key, p.first,
                                                     p.first + shape_numel(p.shape))));
  auto out = std::make_shared<catalog::Catalog>();
  for (const auto& p : parameters) {
    catalog::LogicalTensor t = by_name.at(p.tied_to.empty() ? p.name : p.tied_to);
    if (!p.tied_to.empty()) t.origin = "tied to " + p.tied_to + ": " + t.origin;
    t.name = prefix + p.name;
    out->tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace ckptfs::formats::fsdp
