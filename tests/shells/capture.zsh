# zsh completion capture for tests/test_completions.py: an interactive zsh on a pseudo-terminal (zpty) completes
# each LINE with the shipped _rsinfer (compinit, _arguments); a compadd wrapper prints every word it offers.
# usage: zsh capture.zsh COMPDIR LINE... : prints, for each LINE, "=" LINE then the words zsh's completion offers
zmodload zsh/zpty
compdir=$1; shift
zpty z zsh -f -i
zpty -w z "PROMPT=; RPROMPT=; KEYTIMEOUT=1; fpath=($compdir \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w z 'compadd () {
  local -a captured
  builtin compadd -O captured "$@"
  local w; for w in $captured; do print -r -- $'"'"'\x40\x40M'"'"'"$w"; done
  builtin compadd "$@"
}'
zpty -w z 'end-mark() { print -r -- $'"'"'\x40\x40END'"'"'; BUFFER= }; zle -N end-mark; bindkey "^X" end-mark; bindkey "^I" complete-word'
integer tries
for line in "$@"; do
  print -r -- "=$line"
  zpty -w -n z "$line"$'\t'$'\x18'
  tries=0
  while zpty -r z out; do
    [[ $out == *"@@END"* ]] && break
    [[ $out == *"@@M"* ]] && print -r -- "${${out##*@@M}%%[$'\r\n']*}"
    (( ++tries > 5000 )) && break
  done
done
zpty -d z
