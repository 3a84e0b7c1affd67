"""The lock's parts (dtlab/pins.py): dtlab's own pins and each platform's in its folder, their union
constraints.txt, and relock's split of a freeze back into them."""

import shutil

import pytest

from dtlab import paths, pins


def _copy_parts(to):
    """What relock reads and writes, in a checkout of its own: the platforms' classes and every part."""
    for path in [*pins.pin_files(), *paths.PLATFORMS_DIR.glob("*/__init__.py")]:
        target = to / path.relative_to(paths.REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return to


def test_constraints_txt_is_the_union_of_the_parts_as_setup_sh_wrote_it():
    assert paths.CONSTRAINTS_FILE.read_text() == pins.lock_text(), (
        "constraints.txt is not the parts' union: run scripts/setup.sh")
    names = [pins.canonical(line.split("==")[0]) for line in pins.lock_text().splitlines()
             if line and not line.startswith("#")]
    assert names == sorted(names) and len(names) == len(set(names))


def test_a_platforms_pins_are_its_clients_own_and_live_in_its_folder():
    ray = paths.PLATFORMS_DIR / "ray" / pins.PINS_FILE
    assert ray in pins.pin_files() and pins.pinned("ray") == pins._pins(ray)["ray"].split("==")[1]
    dtlab_own = pins._pins(paths.REPO_ROOT / "dtlab" / pins.PINS_FILE)
    assert "torch" not in pins._pins(ray) and "torch" in dtlab_own
    # A platform whose client is in dtlab's own dependencies (ddp: torch) or built by its role has no part.
    assert not (paths.PLATFORMS_DIR / "ddp" / pins.PINS_FILE).exists()


def test_relock_splits_the_lock_back_into_the_same_parts(tmp_path):
    """The parts in git are what `scripts/setup.sh --relock` writes from this venv: relock of the lock's
    own lines, in a copy of the checkout, rewrites every part to the same text."""
    repo = _copy_parts(tmp_path)
    freeze = [line for line in pins.lock_text().splitlines() if line and not line.startswith("#")]
    written = pins.relock(freeze, repo)
    assert {path.relative_to(repo) for path in written} == {
        path.relative_to(paths.REPO_ROOT) for path in pins.pin_files()}
    for path in pins.pin_files():
        assert (repo / path.relative_to(paths.REPO_ROOT)).read_text() == path.read_text(), path
    assert pins.lock_text(repo) == pins.lock_text()


def test_relock_keeps_a_shared_pin_where_it_was(tmp_path):
    """A package two platforms pull in stays in the part that held it: adding a platform moves no pin."""
    repo = _copy_parts(tmp_path)
    freeze = [line for line in pins.lock_text().splitlines() if line and not line.startswith("#")]
    claims = {name: pins._closure(declared["python_client"]) - pins._closure(["dtlab[test]"])
              for name, declared in pins.platform_declarations(repo).items()}
    shared = sorted(set.intersection(*(claims[name] for name in ("determined", "ray"))))
    if not shared:
        pytest.skip("Determined's and Ray's clients share no package beyond dtlab's own")
    moved = shared[0]
    ray_part, determined_part = (repo / "dtlab/platforms" / name / pins.PINS_FILE
                                 for name in ("ray", "determined"))
    line = pins._pins(determined_part).get(moved) or pins._pins(ray_part)[moved]
    for part in (ray_part, determined_part):  # put it in ray's part, wherever the first owner rule put it
        part.write_text("".join(f"{kept}\n" for name, kept in pins._pins(part).items() if name != moved))
    ray_part.write_text(ray_part.read_text() + f"{line}\n")
    pins.relock(freeze, repo)
    assert moved in pins._pins(ray_part) and moved not in pins._pins(determined_part)


def test_a_package_pinned_in_two_parts_is_refused_in_one_line(tmp_path):
    repo = _copy_parts(tmp_path)
    ray_part = repo / "dtlab/platforms/ray" / pins.PINS_FILE
    ray_part.write_text(ray_part.read_text() + f"torch=={pins.pinned('torch')}\n")
    with pytest.raises(SystemExit) as refused:
        pins.lock_text(repo)
    message = str(refused.value)
    assert "\n" not in message and "torch is pinned in both" in message and str(ray_part) in message
