# Sourced by setup.sh and valkey9.sh: adds an apt source only when no enabled
# entry provides it yet, in either format (one-line sources.list and `.list`
# files, or deb822 `.sources` files). A second entry for the same repository
# and suite with another Signed-By makes apt refuse every source list
# ("Conflicting values set for option Signed-By"), so a new entry copies the
# Signed-By of an existing entry for that repository and suite.
#
# APT_ETC (default /etc/apt) is where the lists are read and written: the
# tests (tests/scripts.rs) point it at directories of their own.

APT_ETC="${APT_ETC:-/etc/apt}"

# One line per enabled entry and suite: "type uri suite components|signed-by".
# URIs lose a trailing slash; an inline (multi-line) Signed-By key reads
# "inline". Arguments: files to leave out (ours, when deciding about them).
apt_source_entries() {
  local file skip
  local -a lists=() deb822=()
  for file in "$APT_ETC/sources.list" "$APT_ETC"/sources.list.d/*.list "$APT_ETC"/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    for skip in "$@"; do [ "$file" != "$skip" ] || continue 2; done
    case "$file" in
      *.sources) deb822+=("$file") ;;
      *) lists+=("$file") ;;
    esac
  done
  if [ ${#lists[@]} -gt 0 ]; then
    awk '
      { sub(/#.*/, "") }
      NF < 3 || ($1 != "deb" && $1 != "deb-src") { next }
      {
        type = $1; signed = ""; i = 2
        if ($2 ~ /^\[/) {
          # [opt=value ...]: up to the word that ends with "]".
          for (; i <= NF; i++) {
            word = $i; gsub(/[][]/, "", word)
            if (tolower(word) ~ /^signed-by=/) { sub(/^[^=]*=/, "", word); signed = word }
            if ($i ~ /\]$/) { i++; break }
          }
        }
        uri = $i; sub(/\/$/, "", uri); line = type " " uri " " $(i + 1)
        for (j = i + 2; j <= NF; j++) line = line " " $j
        print line "|" signed
      }' "${lists[@]}"
  fi
  if [ ${#deb822[@]} -gt 0 ]; then
    awk '
      function flush(   t, u, s, nt, nu, ns, a, b, c, uri) {
        if (enabled && types != "" && uris != "" && suites != "") {
          nt = split(types, t, " "); nu = split(uris, u, " "); ns = split(suites, s, " ")
          for (a = 1; a <= nt; a++) for (b = 1; b <= nu; b++) for (c = 1; c <= ns; c++) {
            uri = u[b]; sub(/\/$/, "", uri)
            print t[a] " " uri " " s[c] " " components "|" signed
          }
        }
        types = uris = suites = components = signed = field = ""; enabled = 1
      }
      BEGIN { enabled = 1 }
      FNR == 1 { flush() }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (field == "signed-by" && signed !~ /^\//) signed = "inline"; next }
      {
        field = tolower($1); sub(/:$/, "", field)
        value = $0; sub(/^[^:]*:[ \t]*/, "", value); sub(/[ \t]+$/, "", value)
        if (field == "types") types = value
        else if (field == "uris") uris = value
        else if (field == "suites") suites = value
        else if (field == "components") components = value
        else if (field == "signed-by") signed = (value == "" ? "inline" : value)
        else if (field == "enabled") enabled = (tolower(value) != "no")
      }
      END { flush() }' "${deb822[@]}"
  fi
}

# Entries matching uri and suite (sid is unstable), as apt_source_entries
# prints them. $1 uri, $2 suite, then files to leave out.
_apt_matching() {
  local uri="${1%/}" suite="$2"
  shift 2
  apt_source_entries "$@" | awk -v uri="$uri" -v suite="$suite" '
    function alias(s) { return s == "unstable" ? "sid" : s }
    { split($0, parts, "|"); split(parts[1], w, " ") }
    w[2] == uri && alias(w[3]) == alias(suite)'
}

# apt_has_source TYPE URI SUITE COMPONENT [FILE...]: is such an entry enabled
# (leaving FILEs out)?
apt_has_source() {
  local type="$1" uri="$2" suite="$3" component="$4"
  shift 4
  _apt_matching "$uri" "$suite" "$@" | awk -v type="$type" -v component="$component" '
    { split($0, parts, "|"); n = split(parts[1], w, " ") }
    w[1] == type { for (i = 4; i <= n; i++) if (w[i] == component) found = 1 }
    END { exit found ? 0 : 1 }'
}

# apt_ensure_source TYPE URI SUITE COMPONENT NAME: makes sure the entry is
# enabled. Ours is sources.list.d/NAME.sources (deb822); an older one-line
# NAME.list of ours is replaced. Ours goes away when another entry provides
# the same. Says what it did on stderr; returns 1 when it cannot add the
# entry safely (the repository's entry holds an inline key).
apt_ensure_source() {
  local type="$1" uri="${2%/}" suite="$3" component="$4"
  local dir="$APT_ETC/sources.list.d"
  local ours="$dir/$5.sources" legacy="$dir/$5.list" sudo="" signed wanted f
  if [ ! -w "$dir" ] && [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  if apt_has_source "$type" "$uri" "$suite" "$component" "$ours" "$legacy"; then
    for f in "$ours" "$legacy"; do
      if [ -f "$f" ]; then
        printf 'apt-sources: removing %s: another entry provides %s %s %s\n' "$f" "$type" "$uri" "$suite" >&2
        $sudo rm -f "$f"
      fi
    done
    return 0
  fi
  signed="$(_apt_matching "$uri" "$suite" "$ours" "$legacy" | sed -n 's/^[^|]*|\(..*\)$/\1/p' | head -1)"
  if [ "$signed" = inline ]; then
    printf 'apt-sources: the entry for %s %s has an inline Signed-By key: add %s and component %s to it yourself\n' \
      "$uri" "$suite" "$type" "$component" >&2
    return 1
  fi
  wanted="$(printf 'Types: %s\nURIs: %s\nSuites: %s\nComponents: %s\n' "$type" "$uri" "$suite" "$component"
    if [ -n "$signed" ]; then printf 'Signed-By: %s\n' "$signed"; fi)"
  if [ -f "$ours" ] && [ "$(cat "$ours")" = "$wanted" ] && [ ! -f "$legacy" ]; then
    return 0
  fi
  printf 'apt-sources: writing %s (%s %s %s %s%s)\n' "$ours" "$type" "$uri" "$suite" "$component" \
    "${signed:+, Signed-By $signed}" >&2
  printf '%s\n' "$wanted" | $sudo tee "$ours" >/dev/null
  if [ -f "$legacy" ]; then $sudo rm -f "$legacy"; fi
}
