# bash completion for ckptfs(1): its commands, their options, the -o mount options, paths for SRC (a
# directory or a lone weights file), MNT, OUT, DIR and cat's FILE, and the tags of SRC for --tag T and
# -o tag=T and the views of SRC for cat's VIEW_PATH, read with `ckptfs inspect SRC --json`. Plain bash (compgen), no bash-completion helpers needed. The lists
# below are checked against `ckptfs --help`, `ckptfs mount --help` and `ckptfs cat --help` by mount_tests/test_completion.py:
# an option added there is added here too.

_ckptfs_commands="mount inspect export cat index help"
_ckptfs_s3_options="--endpoint --region --s3-path-style --s3-no-sign"
# The -o options; a trailing = marks those that take a value.
_ckptfs_mount_options="threads= max_open= tag= strict strip_prefix= config= read_ahead_kb= prefetch= source_check_ms= decoded_cache_mb=
transpose_cache_mb= endpoint= region= s3_path_style s3_no_sign cache_mb= cache_dir= cache_dir_mb= s3_connections=
gguf_pre= gguf_name= shard_size= stats index_cache= static refresh= uid= gid= umask= allow_other fsname="

_ckptfs_options_of() {
  case $1 in
    mount) echo "-o -f -d --tag --help $_ckptfs_s3_options" ;;
    inspect) echo "--tag --strict --strip-prefix --config --json --tensors $_ckptfs_s3_options" ;;
    export) echo "--tag --strict --strip-prefix --config --universal --shard-size $_ckptfs_s3_options" ;;
    cat) echo "-o --output --tag --strict --strip-prefix --config --help $_ckptfs_s3_options" ;;
    index) echo "--tag --strict --strip-prefix --config --cache $_ckptfs_s3_options" ;;
  esac
}

# The tags of SRC $2 (a local path), by the ckptfs $1: the "name" of each entry of inspect --json's
# "tags" (its keys sit at 6 spaces of indentation; tensor names, deeper, only come with --tensors).
_ckptfs_tags() {
  local bin=$1 src=${2/#\~/$HOME}
  [[ -e $src ]] || return 0  # s3:// sources: no network round trip on a TAB
  command -v "$bin" >/dev/null 2>&1 || bin=ckptfs
  timeout 10 "$bin" inspect "$src" --json 2>/dev/null | sed -n 's/^      "name": "\(.*\)",\{0,1\}$/\1/p'
}

# The files of the tree a mount of SRC $2 shows (by the ckptfs $1, tag $3 if given), as cat's VIEW_PATH:
# the views inspect --json lists for each tag (keys at 10 spaces), at the root for the latest tag and
# under tags/<tag>/ for all, and ckptfs.json. A tree of many files (universal/) is offered as its folder.
_ckptfs_views() {
  local bin=$1 src=${2/#\~/$HOME} tag_args=() kind value latest="" tag=""
  [[ -e $src ]] || return 0
  [[ -n $3 ]] && tag_args=(--tag "$3")
  command -v "$bin" >/dev/null 2>&1 || bin=ckptfs
  printf '%s\n' ckptfs.json
  timeout 10 "$bin" inspect "$src" "${tag_args[@]}" --json 2>/dev/null | sed -n \
    -e 's/^  "latest": "\(.*\)",\{0,1\}$/L \1/p' -e 's/^      "name": "\(.*\)",\{0,1\}$/T \1/p' \
    -e 's/^          "path": "\(.*\)",\{0,1\}$/P \1/p' |
    while read -r kind value; do
      case $kind in
        L) latest=$value ;;
        T) tag=$value ;;
        P) [[ $tag == "$latest" ]] && printf '%s\n' "$value"
           printf '%s\n' "tags/$tag/$value" ;;
      esac
    done
}

# Paths a SRC can be: directories, and lone weights files.
_ckptfs_sources() {
  local path
  compgen -d -- "$1"
  compgen -f -- "$1" | while read -r path; do
    case $path in *.pt | *.pth | *.bin | *.safetensors) [[ -f $path ]] && printf '%s\n' "$path" ;; esac
  done
}

# COMPREPLY from candidates for the whole blank-separated word $1: readline splits words at = and : too
# (COMP_WORDBREAKS), so each reply is only the part after the last such break, the text it replaces.
_ckptfs_reply() {
  local full=$1 breaks=${COMP_WORDBREAKS//[[:space:]]/} candidate keep=""
  shift
  [[ -n $breaks ]] && keep=${full%"${full##*["$breaks"]}"}
  for candidate in "$@"; do
    [[ $candidate == "$full"* ]] && COMPREPLY+=("${candidate#"$keep"}")
  done
}

# Candidates for the -o list $1 (e.g. "threads=4,ta"): the names of options, or a value after name=.
_ckptfs_mount_option_candidates() {
  local list=$1 bin=$2 src=$3 head tail name
  head=${list%"${list##*,}"}
  tail=${list##*,}
  if [[ $tail == *=* ]]; then
    name=${tail%%=*}
    case $name in
      tag) _ckptfs_tags "$bin" "$src" | while read -r t; do printf '%s\n' "$head$name=$t"; done ;;
      cache_dir | index_cache)
        [[ $name == index_cache ]] && printf '%s\n' "${head}index_cache=off"
        compgen -d -- "${tail#*=}" | while read -r d; do printf '%s\n' "$head$name=$d/"; done ;;
    esac
  else
    for name in $_ckptfs_mount_options; do printf '%s\n' "$head$name"; done
  fi
}

_ckptfs() {
  COMPREPLY=()
  local line=${COMP_LINE:0:COMP_POINT} cur words=() bin cmd=mount first=1 i w positionals=() tag=
  read -ra words <<<"$line"
  if [[ $line == *[[:space:]] || ${#words[@]} -eq 0 ]]; then
    cur=""
  else
    cur=${words[${#words[@]} - 1]}
    unset 'words[${#words[@]}-1]'
  fi
  bin=${words[0]:-ckptfs}
  if [[ -n ${words[1]} && " $_ckptfs_commands " == *" ${words[1]} "* ]]; then
    cmd=${words[1]} first=2
  fi
  # The positionals before the word being completed; option values are skipped.
  for ((i = first; i < ${#words[@]}; i++)); do
    w=${words[i]}
    case $w in
      --tag | -t) tag=${words[i + 1]}; ((i++)) ;;
      --tag=*) tag=${w#*=} ;;
      -o | --output | --cache | --shard-size | --endpoint | --region) ((i++)) ;;
      -*) ;;
      *) positionals+=("$w") ;;
    esac
  done
  local prev=${words[${#words[@]} - 1]} candidates=()
  if [[ $prev == -o && $cmd == mount ]]; then
    mapfile -t candidates < <(_ckptfs_mount_option_candidates "$cur" "$bin" "${positionals[0]}")
    _ckptfs_reply "$cur" "${candidates[@]}"
    local reply
    for reply in "${COMPREPLY[@]}"; do  # a value or a directory still to type: no space after it
      [[ $reply == *[=/] ]] && compopt -o nospace 2>/dev/null
    done
    return 0
  fi
  case $cur in
    --tag=* | --cache=* | --output=*) prev=${cur%%=*} cur=${cur#*=} ;;  # the value glued on: complete it alone
  esac
  case $prev in
    --tag | -t)
      mapfile -t candidates < <(_ckptfs_tags "$bin" "${positionals[0]}")
      _ckptfs_reply "$cur" "${candidates[@]}"
      return 0 ;;
    --cache)
      compopt -o filenames 2>/dev/null
      mapfile -t COMPREPLY < <(compgen -d -- "$cur")
      return 0 ;;
    -o | --output)  # cat's FILE (a mount's -o list is completed above)
      compopt -o filenames 2>/dev/null
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return 0 ;;
    --shard-size | --endpoint | --region) return 0 ;;
  esac
  if [[ $cmd == help ]]; then
    return 0
  elif [[ $cur == -* ]]; then
    candidates=($(_ckptfs_options_of "$cmd"))
    ((${#words[@]} == 1)) && candidates+=(--help --version)
    _ckptfs_reply "$cur" "${candidates[@]}"
    return 0
  fi
  ((${#words[@]} == 1)) && mapfile -t COMPREPLY < <(compgen -W "$_ckptfs_commands" -- "$cur")
  if ((${#positionals[@]} == 1)) && [[ $cmd == cat ]]; then
    mapfile -t candidates < <(_ckptfs_views "$bin" "${positionals[0]}" "$tag")
    _ckptfs_reply "$cur" "${candidates[@]}"
    [[ " ${COMPREPLY[*]} " == */" "* ]] && compopt -o nospace 2>/dev/null  # a folder: its files still to type
    return 0
  fi
  compopt -o filenames 2>/dev/null
  if ((${#positionals[@]} == 0)); then
    mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(_ckptfs_sources "$cur")
  elif ((${#positionals[@]} == 1)) && [[ $cmd == mount || $cmd == export ]]; then
    mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -d -- "$cur")  # MNT, OUT
  fi
  return 0
}
complete -F _ckptfs ckptfs
