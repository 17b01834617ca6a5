// The few Python callables the unpickler models instead of keeping them as opaque objects.
#pragma once

#include <string_view>

#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {

// Python 3 and Python 2 (protocols < 3 write the Python 2 name) spellings of the builtins module.
inline bool is_builtins_module(std::string_view module) {
  return module == "builtins" || module == "__builtin__";
}

// The value `callable(*args)` builds when the unpickler models it (OrderedDict(), set(list),
// getattr(cls, name), _codecs.encode(str, 'latin1'), ...); nullptr otherwise. `args` is a Tuple.
// Throws FormatError (without position) when a modelled call has impossible arguments.
ValuePtr construct_builtin(const Value& callable, const ValuePtr& args);

}  // namespace ckptfs::pickle
