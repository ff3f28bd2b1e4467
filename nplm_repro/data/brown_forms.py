"""Brown's words that keep a dot or an apostrophe at their edge (brown_plain.py says why), written by
`python -m nplm_repro.data.brown_plain brown.zip` from Brown's stream; tests/test_tokenize.py checks them."""

FORMS = """
'bout 'cept 'ello 'em 'emselves 'fess 'fore 'im 'low 'mon 'most 'nother 'nough 'nuff 'pache 'round 'scuse 'stead
'tain't 'thirties 'till 'tis 'way 0.025-in. 0.080-in. 1.0-mg. 10-yr. 100-million-lb. 12' 12-oz. 15,500-lb. 160-ml.
2' 24-hr. 24-in. 25-ft. 27-in. 29-Oct. 3-by-6-ft. 3-hp. 36-in. 4' 400-kc. 400-lb. 42-degrees-F. 50' 6' 6-hr. 8-oz.
9' A. Ala. An' App. Ariz. Assn. Ath. Atty. Aubr. Aug. Av. Ave. B. Bldg. Blvd. Brig. C' C. Cal. Calif. Capt. Cf. Ch.
Chavez' Chmn. Cir. Cmdr. Co. Col. Colo. Comin' Conn. Corp. Countin' Ct. D' D. Dak. Dec. Del. Dept. Dist. Dr. Drs.
Dwor' E. Ed. Eng. Eq. Exterminatin' F. Feb. Fig. Figs. Fla. Followin' G. Ga. Gen. Gov. Gre. Grev. H. Hon. I. Ill.
Inc. Ind. J. Jan. Jas. Jr. K. Kan. Kans. Kas. Kentuck' Kissin' Ky. L. La. Listenin' Lond. Lt. Ltd. M. Maj. Mar.
Mass. McN. Md. Messrs. Mfg. Mich. Minn. Miss. Mmes. Mo. Mr. Mrs. Msec. Mt. Mts. N' N. Nev. Nischwitz' No. Nov. O.
OK. Oct. Okla. Ol' Op. Ore. P' P. Pa. Penna. Pfc. Po' Pp. Presbyterian-St. Prof. Prop. Pt. Puttin' R. Racin' Rammin'
Rd. Ref. Rep. Reps. Rev. Rte. Rul. Ry. Ryc' S. SS. Sant' Sec. Seizin' Sen. Sens. Sept. Sha. Shak. Shippin' Shootin'
Smilin' Spec. Sportin' Sr. St. Stat. Supt. T. Tailin' Tech. Tenn. Ter. Tex. U. USN. V. Va. Vol. Vs. W. Wash. Wis.
Wm. Y. Yok. a-stoopin' a. an' appearin' askin' becomin' bein' brandin' buildin' bushwhackin' bustin' bustlin' buyin'
ca. callin' cc. cf. chap. chargin' checkin' chousin' cm. colorin' comin' confusin' considerin' countin' crouchin'
cu. dam' darin' darlin' dell' denyin' dept. dia. doin' drawin' driftin' dry-gulchin' dryin' durin' dustin' ed. eqn.
eqns. etc. ever' ever-lovin' ex-Gov. ex-Mrs. examinin' fig. fightin' figs. ft. gallivantin' gettin' ginnin' givin'
gm. goin' grabbin' grazin' han' hangin' hankerin' herdin' hifalutin' holdin' hp. hr. kc. killin' l' l. lb. lbs.
leavin' lettin' locatin' lyin' mEq. marchin' mc. meanin' meetin' mg. mil. min. ml. mm. mos. nos. nothin' nw. o' ol'
overtakin' oz. p. peggin' pl. playin' pleasin' pp. prayin' prevailin' pro-U.N.F.P. producin' pushin' redeemin'
referrin' rockin' rubbin' runnin' rustlin' s'posin' sayin' sec. seein' seekin' seizin' sellin' seq. sho' shootin'
showin' skinnin' somethin' sp. speakin' sportin' sq. standin' startin' stealin' strainin' swingin' t' tailin' takin'
talkin' th' tho' throwin' travelin' trippin' u. v. var. viz. vs. w. walkin' wearin' what-will-T. workin' worryin'
wrappin' yd. yellin' yrs.
"""
BROWN_FORMS = frozenset(FORMS.split())
