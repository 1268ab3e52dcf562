"""Built-in policy names -> "module:Class". `--policy NAME` resolves here first; any other
"package.module:Class" is imported as a user policy (policies/registry.py)."""

BUILTIN: dict[str, str] = {
    "compaction": "jumpahead.policies.compaction:Compaction",  # micro-compaction of finished reasoning
    "masking": "jumpahead.policies.compaction:ObservationMasking",  # old tool results -> placeholder
    "thinking-clearing": "jumpahead.policies.compaction:ThinkingClearing",
    "clear-tool-uses": "jumpahead.policies.context_edits:ClearToolUses",  # Anthropic clear_tool_uses_20250919
    "clear-thinking": "jumpahead.policies.context_edits:ClearThinking",  # Anthropic clear_thinking_20251015
    "fit": "jumpahead.policies.fit:Fit",  # shrink prompts that exceed the window
    "jump": "jumpahead.policies.jump:Jump",  # logical jump-ahead, online
    "early-jump": "jumpahead.policies.early_jump:EarlyJump",  # the whole next call at the reasoning boundary
    "oracle-jump": "jumpahead.policies.jump:OracleJump",  # driven by a recorded continuation
    "mistaken-jump": "jumpahead.policies.jump:MistakenJump",  # perturbed jumps (recovery study)
}
