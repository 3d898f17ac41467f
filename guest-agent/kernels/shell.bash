# Airlock's shell kernel: the rcfile of `bash --noediting --noprofile --rcfile THIS -i`, which
# the agent (guest-agent/kernel.c) feeds one command line per run on stdin:
#   __al_id=ID; [export -- K=V... &&] { eval -- 'CODE'; } 0<STDIN 3>&-
# Interactive, so that SIGINT abandons the command (a builtin loop included), sets $? to 130
# and comes back to the prompt; PROMPT_COMMAND then reports "done ID STATUS" on fd 3, the
# agent's socket ("ready" the first time). cwd, variables and functions persist between runs.
PS1='' PS2='' PS4='+ '
unset PS0 HISTFILE MAIL MAILPATH
set +H +o history
__al_prompt() {
    local st=$?
    if [[ -n ${__al_id-} ]]; then
        printf 'done %s %d\n' "$__al_id" "$st" >&3
        unset __al_id
    elif [[ -z ${__al_ready-} ]]; then
        __al_ready=1
        printf 'ready\n' >&3
    fi
}
PROMPT_COMMAND=__al_prompt
