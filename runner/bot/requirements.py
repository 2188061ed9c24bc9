"""The apply requirements of comment applies (``approved``, ``last_push_approved``, ``owners_approved``,
``mergeable``, ``undiverged``; ``owners_approved`` gates merge applies too): which of them a pull request
fails right now, each with the reason and what to do.

Pure: the pull request, its reviews, which reviewers may write, who pushed the head and whether the head
contains the base branch's tip come in; frozen
results go out. Must not: talk to GitHub or git (``runner.bot.pr_holds`` fetches), or read the requirements
from anywhere but the caller (the default branch's ``.kilolock.yml``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from runner.bot import markdown
from runner.bot.github import PullInfo, Review
from runner.bot.owners import IsMember, OwnedGlob, groups_of, missing_groups, shown

# Reviews that change a reviewer's verdict; COMMENTED and PENDING leave the earlier verdict standing,
# as they do on GitHub.
_VERDICTS = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})
_BLOCKING_MERGE_STATES = frozenset({"dirty", "blocked"})


@dataclass(frozen=True, slots=True)
class Unmet:
    """A requirement the pull request fails: its name and why, saying what to do next."""

    name: str
    reason: str


def latest_verdicts(reviews: Iterable[Review]) -> dict[str, Review]:
    """Reviewer → their latest review that carries a verdict (reviews arrive oldest first)."""
    found: dict[str, Review] = {}
    for review in reviews:
        if review.state.upper() in _VERDICTS and review.login:
            found[review.login] = review
    return found


def approval_problem(reviews: Iterable[Review], *, author: str, head_sha: str,
                     writers: frozenset[str]) -> str | None:
    """None when a reviewer with write access other than the author approved the current head and no
    writer's latest verdict is CHANGES_REQUESTED; otherwise what is missing. Reviews by people without
    write access count for nothing either way, as in GitHub's branch protection."""
    verdicts = {login: r for login, r in latest_verdicts(reviews).items() if login in writers}
    wanting = sorted(login for login, r in verdicts.items() if r.state.upper() == "CHANGES_REQUESTED")
    if wanting:
        return "changes are requested by " + ", ".join(f"@{w}" for w in wanting) + \
            ": address them and ask for a new review"
    approvers = [r for login, r in verdicts.items() if r.state.upper() == "APPROVED" and login != author]
    if any(r.commit_id == head_sha for r in approvers):
        return None
    if approvers:
        return (f"the approval is of an earlier commit, not of the head {head_sha[:7]}: ask for a review of the "
                "current head")
    return ("no approving review by someone with write access other than the author: ask a maintainer to "
            "approve")


def last_push_problem(reviews: Iterable[Review], *, head_sha: str, writers: frozenset[str],
                      pushers: frozenset[str]) -> str | None:
    """None when a writer other than whoever pushed the head (its commit's author and committer) approved
    the head itself; an unknown pusher fails closed."""
    if not pushers:
        return (f"GitHub cannot tell who pushed {head_sha[:7]} (its commit is not linked to an account), so no "
                "approval can be shown to come from someone else: push a commit linked to your account")
    verdicts = {login: r for login, r in latest_verdicts(reviews).items() if login in writers}
    if any(r.state.upper() == "APPROVED" and r.commit_id == head_sha and login not in pushers
           for login, r in verdicts.items()):
        return None
    who = ", ".join(f"@{p}" for p in sorted(pushers))
    return (f"the latest push ({head_sha[:7]}, by {who}) is not approved by another reviewer with write access: "
            "ask someone else to approve it")


def head_approvers(reviews: Iterable[Review], *, author: str, head_sha: str, writers: frozenset[str]) -> set[str]:
    """Writers other than the author whose latest verdict approves ``head_sha`` itself (after the last push)."""
    return {login for login, r in latest_verdicts(reviews).items() if login in writers and login != author
            and r.state.upper() == "APPROVED" and r.commit_id == head_sha}


def owners_problem(owned: Sequence[OwnedGlob], reviews: Iterable[Review], *, author: str, head_sha: str,
                   writers: frozenset[str], is_member: IsMember,
                   quote: Callable[[str], str] = markdown.code) -> str | None:
    """None when every owner group a write glob needs has an approval of the head by one of its members
    with write access (not the author); otherwise which groups are missing, for which globs. ``quote``
    makes handles and globs inert where the reason is shown (Markdown inline code by default; the identity
    for a reason that becomes an error, which is shown in a code block)."""
    approvers = head_approvers(reviews, author=author, head_sha=head_sha, writers=writers)
    missing = missing_groups(groups_of(owned), approvers, is_member)
    if not missing:
        return None
    parts = []
    for group in missing:
        globs = [o.glob for o in owned if group in o.groups]
        parts.append(f"{quote(shown(group))} (for {', '.join(quote(g) for g in globs)})")
    unparsable = [o.glob for o in owned if o.unparsable]
    extra = (f"; {', '.join(quote(g) for g in unparsable)} cannot be parsed, so every owner must approve"
             if unparsable else "")
    return (f"no approval of the head {head_sha[:7]} by a member of " + "; ".join(parts) + extra +
            ": ask one member with write access of each to approve the current head")


def mergeable_problem(pr: PullInfo) -> str | None:
    if pr.mergeable is None:
        return "GitHub has not finished checking whether it can be merged: comment again in a moment"
    if not pr.mergeable or pr.mergeable_state in _BLOCKING_MERGE_STATES:
        state = pr.mergeable_state
        if state == "dirty" or not pr.mergeable:
            return "it has merge conflicts with the base branch: resolve them and push"
        return "branch protection blocks the merge (required checks or reviews are missing): satisfy them first"
    return None


def unmet(requirements: Sequence[str], pr: PullInfo, *, reviews: Sequence[Review], contains_base_tip: bool,
          writers: frozenset[str] = frozenset(), pushers: frozenset[str] = frozenset(),
          owners: str | None = None) -> tuple[Unmet, ...]:
    """The requirements among ``requirements`` that ``pr`` fails, in their order. ``writers`` are the
    reviewers with write access; ``pushers`` the logins behind the head commit; ``owners`` the caller's
    :func:`owners_problem` (it needs the footprint and team memberships)."""
    found: list[Unmet] = []
    for name in requirements:
        problem: str | None = None
        if name == "approved":
            problem = approval_problem(reviews, author=pr.author, head_sha=pr.head_sha, writers=writers)
        elif name == "last_push_approved":
            problem = last_push_problem(reviews, head_sha=pr.head_sha, writers=writers, pushers=pushers)
        elif name == "owners_approved":
            problem = owners
        elif name == "mergeable":
            problem = mergeable_problem(pr)
        elif name == "undiverged" and not contains_base_tip:
            problem = (f"the head does not contain the tip of {pr.base_ref}: merge or rebase {pr.base_ref} into the "
                       "branch and push")
        if problem is not None:
            found.append(Unmet(name, problem))
    return tuple(found)
