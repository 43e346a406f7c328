[[ $1 == show && $2 == hostnames ]] || exit 2
tr , '\n' <<<"$3"
