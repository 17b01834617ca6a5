// The index's encoding, generated from one description per struct: `Fields<T>::of(t)` ties T's fields in
// order (`std::tie(t.dp, t.tp, ...)`), and the same description runs the Encoder (t const) and the Decoder
// (t mutable), so writing and reading cannot drift apart; a description that leaves out a member of T does
// not compile (it lists as many fields as T has members, counted: kListsEveryMember). Built in: bools,
// integers (range checked), enums (bounded by kLastEnum), doubles, strings, paths, vectors, maps, pairs,
// optionals, variants (index, then the alternative), shared pointers (an object shared by several holders is
// written once, later uses by number: the decoded checkpoint shares what the parsed one shared). Types
// rebuilt by a function rather than field by field (a File reopens and checks its identity, a BoxAssembly)
// describe a Wire type instead; a type made again whole when decoding (an open
// descriptor) is kMadeAgain.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ckptfs/error.hpp"
#include "index/byte_stream.hpp"

namespace ckptfs::index {

// Specialised per struct: `static auto of(auto& t)`, returning std::tie of every member of T, in order;
// optionally `static void check(const T& t)`, run by the Decoder once the fields are decoded.
template <class T>
struct Fields;

// Specialised for a type held by shared pointer that is rebuilt from a wire value: `using type = W;`,
// `static W to(const T&)`, `static std::shared_ptr<...T> from(W&&)` or `from(W&&, const Decoder&)` (may throw
// FormatError).
template <class T>
struct Wire {};

// Specialised true for a type the index keeps nothing of: its value is made again when the index is
// loaded (an open descriptor, a store's client), so it has no Fields<T>, and decodes default-built; held by
// shared pointer (a cache of the command that loads the index), it decodes as the object of its type the
// Decoder was given (Decoder::give), else null.
template <class T>
inline constexpr bool kMadeAgain = false;

// The last enumerator of each enum the index holds: a decoded value above it is damage.
template <class E>
inline constexpr E kLastEnum = E{};

namespace codec_detail {

template <class T, template <class...> class Of>
inline constexpr bool kIs = false;
template <template <class...> class Of, class... A>
inline constexpr bool kIs<Of<A...>, Of> = true;

template <class T>
concept Wired = requires {
  typename Wire<T>::type;
};

template <class T>
concept Signed = std::is_integral_v<T> && std::is_signed_v<T> && !std::is_same_v<T, bool>;
template <class T>
concept Unsigned = std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool>;

// How a shared pointer starts: null, an object written here, or one written before (then its number).
enum Reference : uint64_t { kNull = 0, kNew = 1, kSeen = 2 };

// Converts to any type: an aggregate T is brace-initialised from as many of these as it has members.
struct AnyMember {
  template <class M>
  operator M() const;  // (only named in unevaluated operands)
};

template <class T, class... A>
constexpr size_t member_count() {
  if constexpr (requires { T{A{}..., AnyMember{}}; })
    return member_count<T, A..., AnyMember>();
  else
    return sizeof...(A);
}

template <class T>
inline constexpr size_t kListed = std::tuple_size_v<decltype(Fields<T>::of(std::declval<T&>()))>;

// Fields<T> names as many fields as T has members.
template <class T>
inline constexpr bool kListsEveryMember = kListed<T> == member_count<T>();

// The fields of `t` (const when encoding), checked to be every member of T.
template <class T>
auto fields_of(T& t) {
  using U = std::remove_const_t<T>;
  static_assert(
      std::is_aggregate_v<U>,
      "Fields<T> describes an aggregate (whose members can be counted); a type rebuilt by a function "
      "has a Wire");
  static_assert(kListsEveryMember<U>,
                "Fields<T>::of leaves out a member of T: list it (index_file.hpp's "
                "kFormatVersion changes with what the index holds)");
  return Fields<U>::of(t);
}

}  // namespace codec_detail

class Encoder {
 public:
  template <class... T>
  void operator()(const T&... v) {
    (one(v), ...);
  }
  std::string take() { return std::move(out_.data()); }

 private:
  template <class T>
  void one(const T& v) {
    using namespace codec_detail;
    if constexpr (std::is_same_v<T, bool>) {
      out_.boolean(v);
    } else if constexpr (std::is_enum_v<T> || Unsigned<T>) {
      out_.u64(static_cast<uint64_t>(v));
    } else if constexpr (Signed<T>) {
      out_.i64(v);
    } else if constexpr (std::is_same_v<T, double>) {
      out_.real(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      out_.text(v);
    } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
      out_.text(v.string());
    } else if constexpr (kIs<T, std::vector> || kIs<T, std::map>) {
      out_.u64(v.size());
      for (const auto& x : v) one(x);
    } else if constexpr (kIs<T, std::pair>) {
      one(v.first);
      one(v.second);
    } else if constexpr (kIs<T, std::optional>) {
      out_.boolean(v.has_value());
      if (v) one(*v);
    } else if constexpr (kIs<T, std::variant>) {
      out_.u64(v.index());
      std::visit([&](const auto& alternative) { one(alternative); }, v);
    } else if constexpr (kIs<T, std::shared_ptr>) {
      if constexpr (!kMadeAgain<std::remove_const_t<typename T::element_type>>) shared(v);
    } else if constexpr (!kMadeAgain<T>) {
      std::apply([&](const auto&... field) { (one(field), ...); }, fields_of(v));
    }
  }

  template <class T>
  void shared(const std::shared_ptr<T>& p) {
    using U = std::remove_const_t<T>;
    if (!p) return out_.u64(codec_detail::kNull);
    auto& ids = ids_[typeid(U)];
    if (auto it = ids.find(p.get()); it != ids.end()) {
      out_.u64(codec_detail::kSeen);
      out_.u64(it->second);
      return;
    }
    out_.u64(codec_detail::kNew);
    if constexpr (codec_detail::Wired<U>)
      one(Wire<U>::to(*p));
    else
      one(*p);
    // Numbered once written, so no object can refer to itself: object graphs are acyclic (the unpickler
    // refuses a value that contains itself), and a decoded one is too, whatever the bytes.
    ids.emplace(p.get(), ids.size());
  }

  ByteWriter out_;
  std::unordered_map<std::type_index, std::unordered_map<const void*, uint64_t>> ids_;
};

// Reads what Encoder wrote; every inconsistency (a count past the end, a number out of its type's range,
// an unknown enumerator or variant index, a reference to an object not read yet) throws FormatError.
class Decoder {
 public:
  explicit Decoder(std::span<const std::byte> data)
      : in_(std::string_view(reinterpret_cast<const char*>(data.data()), data.size())) {}

  template <class... T>
  void operator()(T&... v) {
    (one(v), ...);
  }
  void finish() const {
    if (!in_.done()) in_.fail("bytes left after the end");
  }
  // What every shared pointer to a T the index keeps nothing of (kMadeAgain<T>) decodes as.
  template <class T>
  void give(std::shared_ptr<T> object) {
    // (T may be incomplete, or const)
    given_[typeid(std::shared_ptr<T>)] = std::const_pointer_cast<std::remove_const_t<T>>(std::move(object));
  }
  // What give() handed it for T, else null: for a Wire<U>::from(wire, decoder) that needs the loading
  // command's objects (the source its files are reopened from).
  template <class T>
  std::shared_ptr<T> given() const {
    const auto it = given_.find(typeid(std::shared_ptr<T>));
    return it == given_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

 private:
  template <class T>
  void one(T& v) {
    using namespace codec_detail;
    if constexpr (std::is_same_v<T, bool>) {
      v = in_.boolean();
    } else if constexpr (std::is_enum_v<T>) {
      const uint64_t x = in_.u64();
      if (x > static_cast<uint64_t>(kLastEnum<T>)) in_.fail("an unknown enumerator");
      v = static_cast<T>(x);
    } else if constexpr (Unsigned<T>) {
      const uint64_t x = in_.u64();
      if (!std::in_range<T>(x)) in_.fail("a number out of range");
      v = static_cast<T>(x);
    } else if constexpr (Signed<T>) {
      const int64_t x = in_.i64();
      if (!std::in_range<T>(x)) in_.fail("a number out of range");
      v = static_cast<T>(x);
    } else if constexpr (std::is_same_v<T, double>) {
      v = in_.real();
    } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::filesystem::path>) {
      v = in_.text();
    } else if constexpr (kIs<T, std::vector>) {
      const uint64_t n = in_.count(1);  // every item takes a byte at least
      v.clear();
      for (uint64_t i = 0; i < n; ++i) one(v.emplace_back());
    } else if constexpr (kIs<T, std::map>) {
      const uint64_t n = in_.count(2);
      v.clear();
      for (uint64_t i = 0; i < n; ++i) {
        std::pair<typename T::key_type, typename T::mapped_type> entry;
        one(entry);
        if (!v.insert(std::move(entry)).second) in_.fail("a key appears twice");
      }
    } else if constexpr (kIs<T, std::pair>) {
      one(v.first);
      one(v.second);
    } else if constexpr (kIs<T, std::optional>) {
      if (in_.boolean())
        one(v.emplace());
      else
        v.reset();
    } else if constexpr (kIs<T, std::variant>) {
      alternative(v, in_.index(std::variant_size_v<T>), std::make_index_sequence<std::variant_size_v<T>>());
    } else if constexpr (kIs<T, std::shared_ptr>) {
      using U = std::remove_const_t<typename T::element_type>;
      if constexpr (kMadeAgain<U>) {
        const auto it = given_.find(typeid(std::shared_ptr<U>));
        v = it == given_.end() ? nullptr : std::static_pointer_cast<U>(it->second);
      } else {
        shared(v);
      }
    } else if constexpr (!kMadeAgain<T>) {
      std::apply([&](auto&... field) { (one(field), ...); }, fields_of(v));
      if constexpr (requires { Fields<T>::check(v); }) Fields<T>::check(v);
    }
  }

  template <class V, size_t... I>
  void alternative(V& v, size_t index, std::index_sequence<I...>) {
    static_cast<void>(((index == I ? (one(v.template emplace<I>()), true) : false) || ...));
  }

  template <class T>
  void shared(std::shared_ptr<T>& p) {
    using U = std::remove_const_t<T>;
    auto& table = tables_[typeid(U)];
    switch (in_.u64()) {
      case codec_detail::kNull:
        p = nullptr;
        return;
      case codec_detail::kSeen:
        p = std::const_pointer_cast<U>(std::static_pointer_cast<const U>(table[in_.index(table.size())]));
        return;
      case codec_detail::kNew:
        break;
      default:
        in_.fail("an unknown reference");
    }
    if (depth_ >= kMaxDepth) in_.fail("objects nested too deep");
    const Nesting nesting(depth_);
    if constexpr (codec_detail::Wired<U>) {
      typename Wire<U>::type wire;
      one(wire);
      if constexpr (requires { Wire<U>::from(std::move(wire), *this); })
        p = Wire<U>::from(std::move(wire), *this);
      else
        p = Wire<U>::from(std::move(wire));
      table.push_back(p);
    } else {
      auto made = std::make_shared<U>();
      one(*made);
      table.push_back(made);
      p = std::move(made);
    }
  }

  struct Nesting {
    int& depth;
    explicit Nesting(int& d) : depth(++d) {}
    ~Nesting() { --depth; }
  };
  static constexpr int kMaxDepth = 1024;  // the unpickler's own nesting bound is 512

  ByteReader in_;
  int depth_ = 0;
  std::unordered_map<std::type_index, std::vector<std::shared_ptr<const void>>> tables_;
  std::unordered_map<std::type_index, std::shared_ptr<void>> given_;
};

}  // namespace ckptfs::index
