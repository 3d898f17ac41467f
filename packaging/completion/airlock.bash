# bash completion for airlock(1): commands, each command's flags, flag values, image names from
# the store ('airlock image ls'), session names from 'airlock ps', conversation ids.
# The flag lists are checked against the CLI's option tables by the docs suite
# (tests/docs/test-completion.py): a flag added or dropped there fails it until added here.

_airlock_global_flags='--connect --debug --quiet --help --version --server --server-key'
_airlock_exec_flags='--image --interactive --tty --transport --net --net-limit --lang --code --kernel --input-wait --env --cwd --timeout
 --output-limit --put --get --get-limit --memory --cpus --lifetime --boot-timeout --disk-budget
 --connect --debug --workdir --sync-back --sync-back-git --sync-back-exec --workdir-limit
 --linger --raw --publish --bind --json --quiet --help'
# chat and run share one table; --resume and --jsonl are chat's alone, --json run's.
_airlock_chat_common='--model --api --api-base --api-key --api-key-file --local --temperature
 --max-tokens --context-window --no-tools --vision --no-vision --computer --retries --request-timeout --auto-run --max-turns
 --max-output --token-budget --run-timeout --system-message --instructions --profile --image
 --memory --cpus --disk-budget --transport --net --net-limit --plain --verbose --workdir
 --checkpoint --sync-back --sync-back-git --sync-back-exec --workdir-limit --connect --debug --help'
_airlock_chat_flags="$_airlock_chat_common --resume --jsonl"
_airlock_run_flags="$_airlock_chat_common --json"
_airlock_import_flags='--name --user --memory --force --help'
_airlock_warm_flags='--memory --cpus --help'
_airlock_build_flags='--toolchain --from --context --base --max-size --timeout --keep-setid --kernels --force --help'
_airlock_export_flags='--ref --help'
_airlock_commit_flags='--checkpoint --force --help'
_airlock_commands='chat run conversations exec image doctor gc ps cp shell port session snapshot volume proc rm mcp help'
_airlock_session_start_flags='--image --memory --cpus --idle-timeout --lifetime --checkpoints --display --name --auto-pause --snapshot --volume'

# The first column of a listing, without its header line, up to its first blank line (image ls
# lists the warm templates after one).
_airlock_column1()
{
    "$@" 2>/dev/null | awk 'NF == 0 { exit } NR > 1 && $1 !~ /^\(/ { print $1 }'
}

_airlock_words()
{
    local IFS=$' \t\n'
    COMPREPLY+=($(compgen -W "$1" -- "$2"))
}

# Completes the value of option $1 into COMPREPLY; 1 when $1 takes no value.
_airlock_value()
{
    local bin=$1 opt=$2 cur=$3
    case $opt in
    --image | -i) _airlock_words "$(_airlock_column1 "$bin" image ls)" "$cur" ;;
    --transport) _airlock_words 'virtio ssh' "$cur" ;;
    --net) _airlock_words 'none allow=' "$cur" ;;
    --sync-back) _airlock_words 'ask yes no' "$cur" ;;
    --checkpoint) _airlock_words 'auto always never' "$cur" ;;
    --api) _airlock_words 'openai anthropic responses' "$cur" ;;
    --local) _airlock_words 'ollama llamacpp lmstudio' "$cur" ;;
    -l | --lang) _airlock_words 'sh bash python shell javascript' "$cur" ;;
    -c | --connect) _airlock_words 'qemu:///system qemu:///session' "$cur" ;;
    --resume) _airlock_words "$(_airlock_column1 "$bin" conversations)" "$cur" ;;
    --profile)
        local dir=${XDG_CONFIG_HOME:-$HOME/.config}/airlock/profiles f names=
        for f in "$dir"/*.yaml "$dir"/*.yml; do
            [ -e "$f" ] && f=${f##*/} && names+=" ${f%.*}"
        done
        _airlock_words "$names" "$cur"
        ;;
    --workdir | -w | --cwd) COMPREPLY+=($(compgen -d -- "$cur")) ;;
    --put | --get | --api-key-file) COMPREPLY+=($(compgen -f -- "$cur")) ;;
    --model | --api-base | --api-key | --temperature | --max-tokens | --context-window | \
        --retries | --request-timeout | --max-turns | --max-output | --token-budget | \
        --run-timeout | --system-message | --instructions | -m | --memory | --cpus | \
        --disk-budget | --workdir-limit | --code | --input-wait | -e | --env | --timeout | \
        --output-limit | --get-limit | --lifetime | --boot-timeout | --linger | --name | --user | \
        --server | --server-key | --session | --idle-timeout) ;;
    *) return 1 ;;
    esac
    return 0
}

_airlock()
{
    COMPREPLY=()
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
    local bin=${COMP_WORDS[0]} cmd= cmdi=0 i w
    # The command is the first word after the global options; an option that is not global
    # there means the chat (airlock --model X).
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
        -c | --connect | --server | --server-key) ((i++)) ;;
        -d | --debug | -q | --quiet | --connect=* | --server=* | --server-key=*) ;;
        -*) cmd=chat cmdi=$((i - 1)) && break ;;
        *) cmd=$w cmdi=$i && break ;;
        esac
    done
    # exec's -c is --code, not the global --connect.
    [ "$cmd" = exec ] && [ "$prev" = -c ] && return 0
    [[ $prev == -* ]] && _airlock_value "$bin" "$prev" "$cur" && return 0
    if [ -z "$cmd" ]; then
        if [[ $cur == -* ]]; then
            _airlock_words "$(printf '%s\n' $_airlock_global_flags $_airlock_chat_flags |
                sort -u)" "$cur"
        else
            _airlock_words "$_airlock_commands" "$cur"
        fi
        return 0
    fi
    # Words after the command that are not options or their values.
    local args=()
    for ((i = cmdi + 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        --) [ "$cmd" = exec ] && return 0 ;; # the guest's command: nothing to offer here
        -*) ;;
        *) args+=("${COMP_WORDS[i]}") ;;
        esac
    done
    case $cmd in
    chat) _airlock_words "$_airlock_chat_flags" "$cur" ;;
    run) [[ $cur == -* ]] && _airlock_words "$_airlock_run_flags" "$cur" ;;
    exec) [[ $cur == -* ]] && _airlock_words "$_airlock_exec_flags" "$cur" ;;
    proc) ((${#args[@]} == 0)) && _airlock_words 'ls logs kill wait' "$cur" ;;
    snapshot) ((${#args[@]} == 0)) && _airlock_words 'save ls rm' "$cur" ;;
    volume) ((${#args[@]} == 0)) && _airlock_words 'create ls rm' "$cur" ;;
    session)
        case ${args[0]:-} in
        '') _airlock_words 'start ls stop extend pause resume fork screenshot input' "$cur" ;;
        start) [[ $cur == -* ]] && _airlock_words "$_airlock_session_start_flags" "$cur" ;;
        esac
        ;;
    image)
        case ${args[0]:-} in
        '') [[ $cur == -* ]] && _airlock_words '--help' "$cur" ||
            _airlock_words 'ls build import rm warm inspect export-base commit' "$cur" ;;
        build)
            if [[ $prev == --from || $prev == --context ]]; then
                COMPREPLY+=($(compgen -f -- "$cur"))
            elif ((${#args[@]} < 2)) && [[ $cur != -* ]]; then
                _airlock_words 'debian tiny sshd desktop' "$cur"
            else
                _airlock_words "$_airlock_build_flags" "$cur"
            fi
            ;;
        rm | inspect) ((${#args[@]} < 2)) && _airlock_words "$(_airlock_column1 "$bin" image ls)" "$cur" ;;
        export-base)
            if [[ $cur == -* ]]; then
                _airlock_words "$_airlock_export_flags" "$cur"
            elif ((${#args[@]} < 2)); then
                _airlock_words "$(_airlock_column1 "$bin" image ls)" "$cur"
            fi
            ;;
        commit)
            if [[ $cur == -* ]]; then
                _airlock_words "$_airlock_commit_flags" "$cur"
            elif ((${#args[@]} < 2)); then
                _airlock_words "$(_airlock_column1 "$bin" ps)" "$cur"
            fi
            ;;
        ls) [[ $cur == -* ]] && _airlock_words '--hosts' "$cur" ;;
        warm)
            if [[ $cur == -* ]]; then
                _airlock_words "$_airlock_warm_flags" "$cur"
            elif ((${#args[@]} < 2)); then
                _airlock_words "$(_airlock_column1 "$bin" image ls)" "$cur"
            fi
            ;;
        import)
            if [[ $cur == -* ]]; then
                _airlock_words "$_airlock_import_flags" "$cur"
            else
                COMPREPLY+=($(compgen -f -- "$cur"))
            fi
            ;;
        esac
        ;;
    cp)
        if [[ $cur == -* ]]; then
            _airlock_words '--help' "$cur"
        elif ((${#args[@]} < 2)); then
            local s
            for s in $(_airlock_column1 "$bin" ps); do
                [[ $s: == "$cur"* ]] && COMPREPLY+=("$s:/")
            done
            COMPREPLY+=($(compgen -f -- "$cur"))
            compopt -o nospace 2>/dev/null
        fi
        ;;
    port)
        if [[ $cur == -* ]]; then
            _airlock_words '--bind --help' "$cur"
        elif ((${#args[@]} < 1)); then
            _airlock_words "$(_airlock_column1 "$bin" ps)" "$cur"
        fi
        ;;
    mcp)
        case $prev in
        --image) _airlock_words "$(_airlock_column1 "$bin" image ls)" "$cur" ;;
        --sessions | --memory-max | --cpus-max | --lifetime-max) ;;
        *) _airlock_words '--image --sessions --memory-max --cpus-max --lifetime-max --allow-network --help' "$cur" ;;
        esac
        ;;
    conversations | doctor | gc | ps | help) _airlock_words '--help' "$cur" ;;
    esac
    return 0
}
complete -F _airlock airlock
