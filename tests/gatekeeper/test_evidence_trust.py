"""When CI's evidence may be labelled trusted: the workflow file and what it runs, as the base branch has them."""

from __future__ import annotations

from typing import NamedTuple

from gatekeeper.evidence_trust import untrusted_because

WORKFLOW = ".github/workflows/gatekeeper.yml"
PINNED = """\
on: pull_request
jobs:
  evidence:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683
      - uses: ./.github/actions/collect
      - uses: docker://alpine@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
      - run: gatekeeper collect --policy .github/gatekeeper.yml --base "$BASE" --out evidence.json
  reuse:
    uses: octo-org/workflows/.github/workflows/x.yml@0123456789abcdef0123456789abcdef01234567
"""


class Entry(NamedTuple):
    sha: str


BASE_TREE = {WORKFLOW: Entry("w1"), ".github/actions/collect/action.yml": Entry("a1"), "src/x.py": Entry("x1")}


def test_the_base_branchs_pinned_workflow_is_trusted():
    assert untrusted_because(WORKFLOW, PINNED, dict(BASE_TREE, **{"src/x.py": Entry("x2")}), BASE_TREE) is None


def test_a_workflow_the_pr_edits_is_not():
    head = dict(BASE_TREE, **{WORKFLOW: Entry("w2")})
    assert "the pull request changes `.github/workflows/gatekeeper.yml`" in untrusted_because(WORKFLOW, PINNED, head,
                                                                                              BASE_TREE)


def test_a_workflow_the_base_branch_lacks_is_not():
    head = dict(BASE_TREE)
    base = {k: v for k, v in BASE_TREE.items() if k != WORKFLOW}
    assert "the base branch has no" in untrusted_because(WORKFLOW, PINNED, head, base)


def test_a_local_action_the_pr_edits_is_not():
    for head in (dict(BASE_TREE, **{".github/actions/collect/action.yml": Entry("a2")}),
                 dict(BASE_TREE, **{".github/actions/collect/run.sh": Entry("new")})):
        assert "a local action the pull request changes" in untrusted_because(WORKFLOW, PINNED, head, BASE_TREE)


def test_unpinned_actions_are_not():
    for ref in ("actions/checkout@v4", "actions/checkout@main", "actions/checkout", "docker://alpine:3",
                "actions/checkout@11bd719"):
        text = PINNED.replace("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", ref)
        assert f"uses `{ref}`" in untrusted_because(WORKFLOW, text, BASE_TREE, BASE_TREE), ref


def test_unreadable_workflows_are_not():
    assert "not valid YAML" in untrusted_because(WORKFLOW, "jobs: [", BASE_TREE, BASE_TREE)
    assert "no readable" in untrusted_because(WORKFLOW, None, BASE_TREE, BASE_TREE)


def test_the_repository_as_its_own_action_is_trusted_only_while_the_pr_changes_nothing_it_holds():
    text = PINNED.replace("./.github/actions/collect", "./")
    assert untrusted_because(WORKFLOW, text, BASE_TREE, BASE_TREE) is None
    head = dict(BASE_TREE, **{"src/x.py": Entry("x2")})
    assert "a local action the pull request changes (src/x.py)" in untrusted_because(WORKFLOW, text, head, BASE_TREE)
