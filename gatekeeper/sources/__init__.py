"""Loaders that turn each way a change can arrive into the one `ChangeSet` model.

  git.py     a local git range (and `GitSnapshot`, the repository at a commit)
  diff.py    a unified diff in git's format
  github.py  saved GitHub REST responses: PR files, PR commits, the pull request object

They must agree: the same change read from each gives the same ChangeSet, up to what a source cannot see
(GitHub's PR files carry no file modes, so no symlink or mode-change facts and no binary flag; submodules
are inferred from what GitHub sends for them, see github.py).
"""
