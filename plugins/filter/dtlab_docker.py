"""Filter dtlab_image_label: one label of the image community.docker.docker_image_info found, or "".

    "{{ info.images | dtlab_image_label('dtlab.image.inputs') }}"

Labels live in the image's config, which Docker returns alike from its classic and its containerd image
store (unlike the image ID). A missing image, an image without labels, or without that one, gives "".
A label name may hold dots (Docker's reverse-DNS convention), which Jinja's attribute lookups would split.
"""

from __future__ import annotations


def dtlab_image_label(images, name):
    for image in images or []:
        labels = ((image or {}).get("Config") or {}).get("Labels") or {}
        return str(labels.get(name) or "")
    return ""


class FilterModule:
    def filters(self):
        return {"dtlab_image_label": dtlab_image_label}
