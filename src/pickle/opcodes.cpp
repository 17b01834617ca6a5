#include "pickle/opcodes.hpp"

namespace ckptfs::pickle::op {

std::string_view name(uint8_t opcode) {
  switch (opcode) {
#define CKPTFS_OPCODE_NAME(x) \
  case x:                     \
    return #x;
    CKPTFS_OPCODE_NAME(MARK)
    CKPTFS_OPCODE_NAME(STOP)
    CKPTFS_OPCODE_NAME(POP) CKPTFS_OPCODE_NAME(POP_MARK) CKPTFS_OPCODE_NAME(DUP) CKPTFS_OPCODE_NAME(
        FLOAT) CKPTFS_OPCODE_NAME(INT) CKPTFS_OPCODE_NAME(BININT) CKPTFS_OPCODE_NAME(BININT1)
        CKPTFS_OPCODE_NAME(LONG) CKPTFS_OPCODE_NAME(BININT2) CKPTFS_OPCODE_NAME(NONE) CKPTFS_OPCODE_NAME(
            PERSID) CKPTFS_OPCODE_NAME(BINPERSID) CKPTFS_OPCODE_NAME(REDUCE) CKPTFS_OPCODE_NAME(STRING)
            CKPTFS_OPCODE_NAME(BINSTRING) CKPTFS_OPCODE_NAME(SHORT_BINSTRING) CKPTFS_OPCODE_NAME(
                UNICODE) CKPTFS_OPCODE_NAME(BINUNICODE) CKPTFS_OPCODE_NAME(APPEND) CKPTFS_OPCODE_NAME(BUILD)
                CKPTFS_OPCODE_NAME(GLOBAL) CKPTFS_OPCODE_NAME(DICT) CKPTFS_OPCODE_NAME(
                    EMPTY_DICT) CKPTFS_OPCODE_NAME(APPENDS) CKPTFS_OPCODE_NAME(GET) CKPTFS_OPCODE_NAME(BINGET)
                    CKPTFS_OPCODE_NAME(INST) CKPTFS_OPCODE_NAME(LONG_BINGET) CKPTFS_OPCODE_NAME(
                        LIST) CKPTFS_OPCODE_NAME(EMPTY_LIST) CKPTFS_OPCODE_NAME(OBJ) CKPTFS_OPCODE_NAME(PUT)
                        CKPTFS_OPCODE_NAME(BINPUT) CKPTFS_OPCODE_NAME(LONG_BINPUT) CKPTFS_OPCODE_NAME(SETITEM)
                            CKPTFS_OPCODE_NAME(TUPLE) CKPTFS_OPCODE_NAME(EMPTY_TUPLE) CKPTFS_OPCODE_NAME(
                                SETITEMS) CKPTFS_OPCODE_NAME(BINFLOAT) CKPTFS_OPCODE_NAME(PROTO)
                                CKPTFS_OPCODE_NAME(NEWOBJ) CKPTFS_OPCODE_NAME(EXT1) CKPTFS_OPCODE_NAME(
                                    EXT2) CKPTFS_OPCODE_NAME(EXT4) CKPTFS_OPCODE_NAME(TUPLE1)
                                    CKPTFS_OPCODE_NAME(TUPLE2) CKPTFS_OPCODE_NAME(TUPLE3) CKPTFS_OPCODE_NAME(
                                        NEWTRUE) CKPTFS_OPCODE_NAME(NEWFALSE) CKPTFS_OPCODE_NAME(LONG1)
                                        CKPTFS_OPCODE_NAME(LONG4) CKPTFS_OPCODE_NAME(BINBYTES)
                                            CKPTFS_OPCODE_NAME(SHORT_BINBYTES) CKPTFS_OPCODE_NAME(
                                                SHORT_BINUNICODE) CKPTFS_OPCODE_NAME(BINUNICODE8)
                                                CKPTFS_OPCODE_NAME(BINBYTES8) CKPTFS_OPCODE_NAME(EMPTY_SET)
                                                    CKPTFS_OPCODE_NAME(ADDITEMS) CKPTFS_OPCODE_NAME(FROZENSET)
                                                        CKPTFS_OPCODE_NAME(NEWOBJ_EX) CKPTFS_OPCODE_NAME(
                                                            STACK_GLOBAL) CKPTFS_OPCODE_NAME(MEMOIZE)
                                                            CKPTFS_OPCODE_NAME(FRAME)
                                                                CKPTFS_OPCODE_NAME(BYTEARRAY8)
                                                                    CKPTFS_OPCODE_NAME(NEXT_BUFFER)
                                                                        CKPTFS_OPCODE_NAME(READONLY_BUFFER)
#undef CKPTFS_OPCODE_NAME
                                                                            default : return {};
  }
}

}  // namespace ckptfs::pickle::op
