# The machine's own Debian archive, for another suite (sourced, not run).
#
# apt_sources_for_suite SUITE CODENAME [ETC]
#   Prints, as deb822 paragraphs, the apt sources ETC (default /etc/apt) already has for
#   the release CODENAME, with only the suite changed to SUITE: the same archive (a local
#   mirror stays the mirror), components, keys and options. It reads deb822 *.sources
#   files and one-line sources.list / *.list files, and keeps `deb` entries of CODENAME
#   itself that have the `main` component; security, updates and backports suites and
#   other archives (their own suite names or components) are left out. Prints nothing
#   when there is none.

apt_sources_for_suite() {
  local suite=$1 codename=$2 etc=${3:-/etc/apt} file
  for file in "$etc/sources.list" "$etc"/sources.list.d/*.list; do
    [[ -r "$file" ]] || continue
    awk -v suite="$suite" -v codename="$codename" '
      function field(key) {  # one-line option name -> deb822 field name
        if (key == "arch") return "Architectures"
        if (key == "signed-by") return "Signed-By"
        if (key == "trusted") return "Trusted"
        if (key == "lang") return "Languages"
        if (key == "target") return "Targets"
        return ""
      }
      { sub(/#.*/, "") }
      $1 != "deb" { next }
      {
        options = ""; n = 2
        if ($2 ~ /^\[/) {  # [key=value ...] up to the closing bracket
          while (n <= NF) {
            word = $n; n++
            gsub(/[][]/, "", word)
            if (word != "" && split(word, kv, "=") == 2 && field(kv[1]) != "")
              options = options field(kv[1]) ": " kv[2] "\n"
            if ($(n - 1) ~ /\]$/) break
          }
        }
        uri = $n; release = $(n + 1); components = ""; main = 0
        for (i = n + 2; i <= NF; i++) {
          components = components (components == "" ? "" : " ") $i
          if ($i == "main") main = 1
        }
        if (release != codename || !main) next
        printf "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n%s\n", uri, suite, components, options
      }
    ' "$file"
  done
  for file in "$etc"/sources.list.d/*.sources; do
    [[ -r "$file" ]] || continue
    awk -v suite="$suite" -v codename="$codename" '
      function flush(   i, found, words, main, deb) {
        if (count > 0) {
          split(value["types"], words, /[ \t]+/)
          for (i in words) if (words[i] == "deb") deb = 1
          split(value["suites"], words, /[ \t]+/)
          for (i in words) if (words[i] == codename) found = 1
          split(value["components"], words, /[ \t]+/)
          for (i in words) if (words[i] == "main") main = 1
          if (deb && found && main && tolower(value["enabled"]) != "no") {
            for (i = 1; i <= count; i++) {
              if (keys[i] == "types") print "Types: deb"
              else if (keys[i] == "suites") print "Suites: " suite
              else printf "%s", text[i]
            }
            print ""
          }
        }
        count = 0; delete value; delete keys; delete text
      }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (count > 0) text[count] = text[count] $0 "\n"; next }
      {
        key = tolower(substr($0, 1, index($0, ":") - 1))
        rest = substr($0, index($0, ":") + 1)
        gsub(/^[ \t]+|[ \t]+$/, "", rest)
        count++; keys[count] = key; text[count] = $0 "\n"; value[key] = rest
      }
      END { flush() }
    ' "$file"
  done
}
