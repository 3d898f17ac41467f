# Airlock's shell kernel: the rcfile of `bash --noediting --noprofile --rcfile THIS -i`, which
# the agent (guest-agent/kernel.c) feeds one command line per run on stdin:
#   __al_id=ID; [__al_undo="..."; export -- K=V... &&] { eval -- 'CODE'; } 0<STDIN 3>&- 4>&-
# Interactive, so that SIGINT abandons the command (a builtin loop included), sets $? to 130
# and comes back to the prompt; PROMPT_COMMAND then reports "done ID STATUS" on fd 3, the
# agent's socket ("ready" the first time). cwd, variables and functions persist between runs;
# the run's own KEY=VALUE entries do not: PROMPT_COMMAND evaluates __al_undo at the top level
# (so that the variables it declares again are globals), even after an interrupt.
PS1='' PS2='' PS4='+ '
unset PS0 HISTFILE MAIL MAILPATH
set +H +o history
__al_prompt() {
    local st=$1
    if [[ -n ${__al_id-} ]]; then
        printf 'done %s %d\n' "$__al_id" "$st" >&3
        unset __al_id
    elif [[ -z ${__al_ready-} ]]; then
        __al_ready=1
        printf 'ready\n' >&3
    fi
}
PROMPT_COMMAND='__al_st=$?; eval "${__al_undo-}"; unset __al_undo; __al_prompt $__al_st'
