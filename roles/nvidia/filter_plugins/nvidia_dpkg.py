"""Filters over dpkg's package list, for the nvidia role (tests: tests/provision/test_nvidia_dpkg.py).

The role asks dpkg-query once with vars/main.yml's __nvidia_dpkg_query_format, one package a line:
state, name, version and Depends, tab-separated. From those lines:

    "{{ lines | nvidia_kernel_flavour_of(ansible_facts['kernel'], inventory_hostname) }}"
        -> {flavour, error}: the flavour of the linux-image metapackage that boots the running kernel
           (generic, generic-hwe-24.04, virtual, amd64, ...); linux-headers-<flavour> then follows
           every later kernel of that line, so DKMS can rebuild the module for it.
    "{{ lines | nvidia_branch_packages(nvidia_driver_branch) }}"
        -> the installed packages of the driver branch: the ones to hold.
"""

from __future__ import annotations

import re

IMAGE_PREFIX = "linux-image-"


def _is_image_metapackage(name):
    """linux-image-generic, linux-image-generic-hwe-24.04, Debian's linux-image-amd64; not a kernel's
    own image, which starts with its release (linux-image-6.8.0-45-generic, or unsigned-6.11.0-29-...)."""
    rest = name[len(IMAGE_PREFIX) :]
    return name.startswith(IMAGE_PREFIX) and rest[:1].isalpha() and not rest.startswith("unsigned-")


def _rows(dpkg_lines):
    """(name, version, dependency names) of each installed package."""
    for line in dpkg_lines:
        state, name, version, depends = (str(line).split("\t") + ["", "", ""])[:4]
        if state != "installed":
            continue
        names = {
            alternative.strip().split(" ")[0].split(":")[0]
            for dependency in depends.split(",")
            for alternative in dependency.split("|")
            if alternative.strip()
        }
        yield name, version, names


def nvidia_kernel_flavour_of(dpkg_lines, kernel_release, host="this node"):
    """The flavour of the installed linux-image metapackage for the running kernel, or one line saying
    why there is none. GA and HWE kernels of Ubuntu 24.04 both run as "-generic", so the release alone
    cannot tell linux-headers-generic from linux-headers-generic-hwe-24.04: the metapackage that depends
    on the running kernel's image can. With a newer kernel installed but not booted yet no metapackage
    names the running one; a single installed metapackage is then the line the node follows."""
    kernel_release = str(kernel_release)
    metapackages = {name: depends for name, _, depends in _rows(dpkg_lines) if _is_image_metapackage(name)}
    booting = sorted(
        name
        for name, depends in metapackages.items()
        if {IMAGE_PREFIX + kernel_release, f"{IMAGE_PREFIX}unsigned-{kernel_release}"} & depends
    )
    candidates = booting or (sorted(metapackages) if len(metapackages) == 1 else [])
    if candidates:
        return {"flavour": candidates[0][len(IMAGE_PREFIX) :], "error": ""}
    found = ", ".join(sorted(metapackages)) or "none"
    return {
        "flavour": "",
        "error": (
            f"nvidia: {host}: no installed linux-image metapackage depends on the running kernel "
            f"{kernel_release} (installed metapackages: {found}), so the kernel headers for DKMS cannot "
            "follow its later kernels; set nvidia_kernel_flavour to the node's kernel line (e.g. generic, "
            "generic-hwe-24.04)"
        ),
    }


def nvidia_branch_packages(dpkg_lines, branch):
    """Installed NVIDIA packages of the branch, by name or by version: the branch in the name
    (nvidia-dkms-580-server, libnvidia-compute-580, linux-modules-nvidia-580-server-generic,
    cuda-drivers-580) or the driver's own version (580.95.05-...: Ubuntu's transitional packages of older
    branches, and NVIDIA's packages from branch 590 on, whose names carry no branch)."""
    branch = str(branch)
    in_name = re.compile(rf"(^|-){re.escape(branch)}(-|$)")
    return sorted(
        name
        for name, version, _ in _rows(dpkg_lines)
        if ("nvidia" in name or name.startswith("cuda-drivers"))
        and (in_name.search(name) or version.split(":", 1)[-1].startswith(branch + "."))
    )


class FilterModule:
    def filters(self):
        return {
            "nvidia_kernel_flavour_of": nvidia_kernel_flavour_of,
            "nvidia_branch_packages": nvidia_branch_packages,
        }
