"""Helpers of the provisioning tests."""

from dtlab import paths


def site_plays(directory, *tags: str):
    """A playbook in `directory` holding site.yml's plays tagged with any of `tags`, in site.yml's order: one
    component's play run alone, as the stage playbooks were before they folded into site.yml."""
    import yaml

    site = yaml.safe_load(paths.SITE_PLAYBOOK.read_text())
    plays = [play for play in site if set(play["tags"]) & set(tags)]
    assert plays, f"no play of site.yml is tagged {tags}"
    playbook = directory / f"site-{'-'.join(tags)}.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    return playbook
